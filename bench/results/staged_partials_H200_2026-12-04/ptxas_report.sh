# usage: ptxas_report.sh TREE LABEL  -> lines: label layout kernel registers spill-stores
tree=$1; label=$2
for cfg in "32 4 128 128" "16 4 128 128" "8 4 128 128" "4 4 128 128" "8 4 64 64" "16 4 64 128" "16 4 128 64"; do set -- $cfg
  for v in forward two-pass; do d=$(mktemp -d)
    (cd $tree && PYTHONPATH=$tree python -m nsa_iree.cli inspect --target hopper --heads $1 --kv-heads $2 --head-dim $3 --value-dim $4 --dtype bf16 --variant $v --dump $d >/dev/null 2>&1)
    for f in $(find $d -name "*.ptx"); do
      ptxas -arch=sm_90a -v $f -o /dev/null 2>&1 | awk -v l="$label" -v c="H$1 G$2 D$3 Dv$4 $v" '/Compiling entry function/{k=$7} /spill stores/{s=$5} /Used [0-9]+ registers/{ if (k ~ /fwd_piece|dkdv_piece/) print l" | "c" | "k" | "$5" registers | "s" bytes spill stores"}'
    done; rm -rf $d
  done
done
