"""What a kernel family is: a folder of stage templates, the shapes it serves and the values it renders with."""

from __future__ import annotations

import dataclasses
from typing import Callable


def _no_limits(stage, spec, recipe) -> list[str]:
    return []


def _no_values(spec, recipe) -> dict[str, str]:
    return {}


@dataclasses.dataclass(frozen=True)
class Family:
    """One way of writing a stage's kernel, e.g. the NVIDIA matrix-unit kernels.

    Attributes:
        name: the word a recipe's ``[kernels]`` table names it by ("nvidia", "portable", "cpu"; "linalg").
        folder: where its templates are, under nsa_iree/kernels/: ``<folder>/<stage>.mlir`` renders ``stage``.
        stages: the stages it has a template for.
        limits: ``limits(stage, spec, recipe)``, why it cannot serve spec's shape on the recipe's target
            (empty: it can). Only :func:`nsa_iree.kernels.choose` calls it.
        values: ``values(spec, recipe)``, the ``${NAME}`` values its templates use beyond the configuration's
            and the recipe's (nsa_iree.render.template_values).
        helpers: templates a module needs (first) once any of its stages is rendered by this family.
        device: the recipe's ``[kernels]`` key naming the executable target (an ``#hal.executable.target`` the
            iree-compile flags cannot name, e.g. sm_90a's) of a module that holds any of its stages: the module then
            names its device itself (nsa_iree.render.render_module). None: the flags' device.
    """

    name: str
    folder: str
    stages: tuple[str, ...]
    limits: Callable[..., list[str]] = _no_limits
    values: Callable[..., dict[str, str]] = _no_values
    helpers: tuple[str, ...] = ()
    device: str | None = None

    def template(self, stage: str) -> str:
        """The template rendering `stage`, relative to nsa_iree/kernels/."""
        if stage not in self.stages and stage not in self.helpers:
            raise ValueError(f"the {self.name} kernels have no template for stage {stage!r}")
        return f"{self.folder}/{stage}.mlir"
