# lit configuration for the IR-level tests: one file per lowering behaviour.
# %render prints a rendered module (nsa-iree render); %cpu_flags, %gfx950_flags, ... are the recipes' flags.
# iree-compile reading stdin names its dumps module__stdin__*.
import os
import sys

import lit.formats

config.name = "nsa_iree"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".test"]
config.excludes = ["cat_dumps.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(os.environ.get("NSA_IREE_LIT_OUT", "/tmp/nsa_iree_lit"))

repo = os.path.dirname(os.path.dirname(config.test_source_root))
sys.path.insert(0, repo)
from nsa_iree.recipes import load_recipe  # noqa: E402

config.environment["PYTHONPATH"] = repo + os.pathsep + os.environ.get("PYTHONPATH", "")
config.environment["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
config.substitutions.append(("%cat_dumps", f"{sys.executable} {os.path.join(config.test_source_root, 'cat_dumps.py')}"))
config.substitutions.append(("%repo", repo))
config.substitutions.append(("%render", f"{sys.executable} -m nsa_iree.cli render"))
for target in ("cpu", "gfx950", "gfx942", "cuda", "hopper"):
    if not os.path.exists(os.path.join(repo, "nsa_iree", "pipelines", f"{target}.toml")):
        continue
    config.substitutions.append((f"%{target}_flags", " ".join(load_recipe(target).flags)))
