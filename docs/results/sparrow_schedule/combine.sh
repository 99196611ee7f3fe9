#!/bin/bash
# one comparison of every arm: the runs of both out folders (symlinked) and their cached evaluations
set -e
rm -rf /work/exp/compare_all && mkdir -p /work/exp/compare_all/runs /work/exp/compare_all/eval
for d in /work/exp/compare_sparrow /work/exp/compare_sched; do
  for r in $d/runs/*; do ln -s $r /work/exp/compare_all/runs/$(basename $r); done
  cp $d/eval/*.json /work/exp/compare_all/eval/
done
cd /work/exp
PYTHONPATH=/work/exp/snap/src python3 -c "import sys; from sparserl.cli import main; sys.argv[0]='sparserl'; sys.exit(main())" compare default train.prompts_per_step=2 data.eval=null checkpoint.every=0 --arms "dense,sparse_rl,sparse_rl_b24=algorithm.correction=sparse_rl;rollout.kv_budget=24,sched=algorithm.correction=sparse_rl;rollout.kv_schedule=/work/exp/schedule_p5_050.json,preset:sparrow" --seeds 3 --steps 10 --eval arith:seed=1000 --eval-limit 32 --out /work/exp/compare_all
