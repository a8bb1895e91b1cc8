"""Render the MLIR templates under ``nsa_iree/kernels/`` (package data) for one :class:`~nsa_iree.spec.KernelSpec`.

Templates are ``.mlir`` files read by Jinja2 with MLIR-friendly delimiters: ``${NAME}`` is a value, ``<% ... %>``
a statement (on a line of its own, the line is dropped), ``<# ... #>`` a comment. The values are the
configuration's (head counts and dims, block size, T, element types: :func:`configuration_values`), the
recipe's target attributes (empty on CPU) and the rendering family's own (``Family.values``). A name without a
value is an error naming it. Macro files (the ``<% macro %>`` libraries a template imports) may use their
arguments and the configuration's names only (:func:`check_macro_library`), so a macro states what it takes; a
part (text a template includes, seeing its names) declares the names it takes and uses exactly those
(:func:`check_part`). Nothing else in the package writes MLIR.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
import threading

import jinja2
import jinja2.meta

from .kernels import covered, template_for
from .kernels.family import Family
from .recipes import PIPELINES_DIR, Recipe, load_recipe
from .spec import KernelSpec

# Package data, wherever the package is installed (a directory on disk for a wheel or a checkout).
KERNELS_DIR = importlib.resources.files(__package__) / "kernels"

# Every variant's module: the stages it runs, in order (helpers first).
STAGES = {
    "forward": ("kv_blocks", "selected_slots", "forward"),
    "two-pass": ("kv_blocks", "selected_slots", "delta", "dq", "inversion", "piece_sums", "dkdv"),
    "one-pass": ("delta", "onepass"),
    # NSA's top-n block selection (nsa_iree.select_blocks): T is its output slots S, BS the compression's block size
    "select": ("select_blocks",),
    # the NSA layer's gating (nsa_iree.layer.gated_sum): the gated sum, do's products, the gates' dots
    "gates": ("gates",),
    # mean pooling (nsa_iree.mean_pooling on the CPU): G, D and BS of the pooled keys or values
    "pooling": ("pooling",),
}

_MLIR_TYPE = {"f32": "f32", "f16": "f16", "bf16": "bf16"}


def configuration_values(spec: KernelSpec, recipe: Recipe) -> dict[str, str]:
    """The values every template and macro may use: the spec's sizes and element types."""
    wide = spec.dtype == "f32"
    dkdv = spec.dkdv_dtype or spec.dtype
    values = {
        "H": spec.heads, "G": spec.kv_heads, "HPG": spec.heads_per_group, "D": spec.head_dim, "DV": spec.value_dim,
        "BS": spec.block_size, "T": spec.num_blocks, "E": _MLIR_TYPE[spec.dtype],
        # f32 -> E and E -> f32 conversions; for f32 inputs a same-type bitcast that folds away.
        "TRUNCF": "arith.bitcast" if wide else "arith.truncf",
        "EXTF": "arith.bitcast" if wide else "arith.extf",
        "ROWS_PER_PIECE": recipe.rows_per_piece,
        # dk and dv: in E, or in f32 (spec.dkdv_dtype) where their sums are added to others before rounding.
        "DKV_E": _MLIR_TYPE[dkdv],
        "DKV_TRUNCF": "arith.bitcast" if dkdv == "f32" else "arith.truncf",
        # positions per key: 1, or the compression's block size (kernels/common/rules.mlir)
        "KEY_STRIDE": spec.key_stride,
        # keys per row's sliding window, 0 for none (kernels/common/rules.mlir)
        "WINDOW": spec.window,
    }
    return {key: str(value) for key, value in values.items()}


def _package_recipe(target: str) -> Recipe:
    """The default recipe of a rendering: the package's (pipelines/), never the environment's; the compiler
    passes the recipe it compiles with (recipes.load_recipe, which honours $NSA_IREE_PIPELINES_DIR)."""
    return load_recipe(target, PIPELINES_DIR)


CONFIGURATION_NAMES = frozenset(configuration_values(KernelSpec(), _package_recipe("cpu")))


def template_values(spec: KernelSpec, recipe: Recipe, family: Family) -> dict[str, str]:
    """The values of one template of `family`: the configuration's, the recipe's attributes, the family's own."""
    values = configuration_values(spec, recipe)
    for more in (recipe.attributes(spec), family.values(spec, recipe)):
        clash = {key for key in more if key in values and more[key] != values[key]}
        if clash:
            raise ValueError(f"{family.name} values redefine {sorted(clash)}")
        values.update(more)
    return values


def _source(name: str) -> str:
    return (KERNELS_DIR / name).read_text()


def _load(name: str):
    """Jinja's loader: the template's text, and a check that it is unchanged (templates compile once)."""
    source = _source(name)
    return source, None, lambda: _source(name) == source


ENVIRONMENT = jinja2.Environment(
    loader=jinja2.FunctionLoader(_load),
    variable_start_string="${", variable_end_string="}",
    block_start_string="<%", block_end_string="%>",
    comment_start_string="<#", comment_end_string="#>",
    trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
    undefined=jinja2.StrictUndefined, autoescape=False)


def _fail(message: str):
    raise ValueError(message)


_RENDERING = threading.Lock()   # the environment's globals hold one template's configuration at a time
ENVIRONMENT.globals["fail"] = _fail      # ${ fail("...") }: a template's own error, raised while rendering
# The environment's own names (the checks read this, not ENVIRONMENT.globals, which holds a configuration while a
# template renders, under _RENDERING).
_FUNCTIONS = frozenset({"fail"})

_IMPORT = re.compile(r"""<%\s*(?:from|import)\s+["']([\w/.]+)["']""")
_INCLUDE = re.compile(r"""<%\s*include\s+["']([\w/.]+)["']""")
# A part (a file a template includes: it sees the template's names) opens, after its // comment lines, with the
# names it takes: <# part: takes NAME, NAME #> (or "takes nothing").
_PART_HEADER = re.compile(r"\A(?:[ \t]*//[^\n]*\n)*<# part: takes ([\w, ]+?) #>")


def _macro_or_comment(node) -> bool:
    """Whether a top-level node may stand in a macro file: a macro, an import, a set, or text made of blank lines
    and // comments only (anything else would be written into every template importing the file)."""
    nodes = jinja2.nodes
    if isinstance(node, (nodes.Macro, nodes.Import, nodes.FromImport, nodes.Assign)):
        return True
    if not isinstance(node, nodes.Output) or not all(isinstance(n, nodes.TemplateData) for n in node.nodes):
        return False
    lines = "".join(n.data for n in node.nodes).splitlines()
    return all(not line.strip() or line.strip().startswith("//") for line in lines)


@functools.lru_cache(maxsize=None)
def check_macro_library(name: str) -> None:
    """Raise ValueError if macro file `name` uses a name that is neither an argument of its macros nor a
    configuration value (its macros then take all they use as arguments), or holds text outside its macros."""
    source = _source(name)
    tree = ENVIRONMENT.parse(source)
    free = jinja2.meta.find_undeclared_variables(tree) - CONFIGURATION_NAMES - _FUNCTIONS
    if free:
        raise ValueError(f"kernels/{name}: its macros use {sorted(free)}, neither arguments nor configuration values")
    outside = [node.lineno for node in tree.body if not _macro_or_comment(node)]
    if outside:
        raise ValueError(f"kernels/{name}: a macro file holds macros and comments only, not line {outside[0]}")
    for library in _IMPORT.findall(source):
        check_macro_library(library)


@functools.lru_cache(maxsize=None)
def check_part(name: str) -> None:
    """Raise ValueError unless part `name` declares exactly the names it uses beyond the configuration's (a
    missing or an extra one is an error), so that what a part takes from the template including it is stated."""
    source = _source(name)
    header = _PART_HEADER.match(source)
    if header is None:
        raise ValueError(f"kernels/{name}: a part opens with <# part: takes NAME, ... #> (or 'takes nothing')")
    declared = set() if header.group(1) == "nothing" else {n.strip() for n in header.group(1).split(",")}
    used = jinja2.meta.find_undeclared_variables(ENVIRONMENT.parse(source)) - CONFIGURATION_NAMES \
        - _FUNCTIONS
    if used != declared:
        raise ValueError(f"kernels/{name}: the part takes {sorted(declared)} but uses {sorted(used)}")
    for part in _INCLUDE.findall(source):
        check_part(part)
    for library in _IMPORT.findall(source):
        check_macro_library(library)


def render_template(name: str, spec: KernelSpec, recipe: Recipe | None = None, family: Family | None = None) -> str:
    """One template (a path under nsa_iree/kernels/), rendered with `family`'s values (default: the family whose
    folder holds it). Raises KeyError naming any name left without a value."""
    from .kernels import COMMON, FAMILIES

    recipe = recipe or _package_recipe(spec.target)
    if family is None:
        folder = name.rsplit("/", 1)[0]
        family = next(f for f in (COMMON, *FAMILIES.values()) if f.folder == folder)
    source = _source(name)
    for library in _IMPORT.findall(source):
        check_macro_library(library)
    for part in _INCLUDE.findall(source):
        check_part(part)
    values = template_values(spec, recipe, family)
    # The configuration's values are the environment's globals while this template renders, so the macro files
    # it imports, and those they import, see them; the rest only the template itself sees.
    configuration = {key: values.pop(key) for key in CONFIGURATION_NAMES}
    with _RENDERING:
        ENVIRONMENT.globals.update(configuration)
        # An imported macro file is evaluated once and kept (Template._module, Jinja 3.1): drop those of the
        # last configuration, so every import, nested ones included, sees this one's values.
        for template in ENVIRONMENT.cache.values():
            template._module = None
        try:
            return ENVIRONMENT.get_template(name).render(values)
        except jinja2.UndefinedError as err:
            raise KeyError(f"kernels/{name}: no value for {err.message}") from None
        finally:
            for key in configuration:
                del ENVIRONMENT.globals[key]


def module_templates(spec: KernelSpec, variant: str, recipe: Recipe | None = None) -> list[tuple[str, Family]]:
    """The templates of (spec, variant)'s module, in order, each with the family that renders it."""
    recipe = recipe or _package_recipe(spec.target)
    skipped = covered(STAGES[variant], spec, recipe)
    chosen = [template_for(stage, spec, recipe) for stage in STAGES[variant] if stage not in skipped]
    helpers = []
    for _, family in chosen:
        helpers += [(family.template(helper), family) for helper in family.helpers
                    if (family.template(helper), family) not in helpers]
    return helpers + chosen


def render_module(spec: KernelSpec, variant: str, recipe: Recipe | None = None) -> str:
    """The whole module compiled for (spec, variant) with `recipe` (default: the package's recipe of spec's
    target): its stage templates, rendered and concatenated. A function of its arguments alone. Where a family of
    the module names its device (Family.device: an executable target the compile flags cannot name), the module
    names it: its operations go into a module whose default device is that target (named devices win over the
    flags' device), its aliases before it (MLIR takes them only at the top level)."""
    recipe = recipe or _package_recipe(spec.target)
    header = f"// nsa_iree: {variant} for {spec.name}\n"
    templates = module_templates(spec, variant, recipe)
    body = "\n".join(render_template(name, spec, recipe, family) for name, family in templates)
    devices = sorted({recipe.kernel_settings[family.device] for _, family in templates if family.device})
    if len(devices) > 1:
        raise ValueError(f"{spec.name} {variant}: the module's families name {len(devices)} devices")
    return header + (_on_device(body, devices[0]) if devices else body)


# A top-level alias definition (#name = ... or !name = ...): its first line; the lines after it that open with
# white space or a closing bracket continue it.
_ALIAS = re.compile(r"^[#!][\w.$-]+\s*=")


def _on_device(body: str, target: str) -> str:
    """`body`'s aliases, then its operations in a module whose default device is `target` (an
    #hal.executable.target, on the driver it names)."""
    aliases, operations, in_alias = [], [], False
    for line in body.splitlines():
        in_alias = bool(_ALIAS.match(line)) or (in_alias and line[:1] in (" ", "\t", "]", ")", ">", "}"))
        (aliases if in_alias else operations).append(line)
    driver = target.split("<", 1)[1].split(",", 1)[0].strip()
    return "\n".join([*aliases, "module attributes {stream.affinity.default = #hal.device.affinity<@nsa_device>} {",
                      f"util.global private @nsa_device = #hal.device.target<{driver}, [{target}]> : !hal.device",
                      *operations, "}", ""])
