"""Print every file with a given suffix in an IREE dump directory (lit's shell does not glob reliably)."""
import pathlib
import sys

directory, suffix = pathlib.Path(sys.argv[1]), sys.argv[2]
files = sorted(directory.glob(f"*{suffix}"))
if not files:
    sys.exit(f"no *{suffix} file in {directory}")
for f in files:
    sys.stdout.write(f.read_text())
