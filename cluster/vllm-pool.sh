#!/usr/bin/env bash
# FALLBACK only. On a Ray cluster a recipe's `llm.serve` starts, watches and stops the
# pool itself (pipelines/airline-vllm.yaml, README "vLLM on the cluster's GPUs"). This
# script is for GPU machines without Ray, or a pool shared by several runs; nothing
# restarts or stops what it starts.
# Start one vLLM OpenAI-compatible server per GPU on this node and print the recipe lines
# that list them as a pool. Needs the optional extra: pip install -e ".[vllm]".
#   cluster/vllm-pool.sh Qwen/Qwen3-32B 4      # 4 GPUs -> ports 8000..8003
# Prefix caching is on: the factory keeps the static part of every prompt first.
set -euo pipefail
model=${1:?usage: vllm-pool.sh MODEL [GPUS] [FIRST_PORT]}
gpus=${2:-$(nvidia-smi -L | wc -l)}
first_port=${3:-8000}
host=$(hostname -I | awk '{print $1}')
mkdir -p logs
echo "llm:"
echo "  model: $model"
echo "  endpoints:"
for ((i = 0; i < gpus; i++)); do
  port=$((first_port + i))
  CUDA_VISIBLE_DEVICES=$i nohup vllm serve "$model" --host 0.0.0.0 --port "$port" \
    --enable-prefix-caching --max-num-seqs 256 > "logs/vllm-$port.log" 2>&1 &
  echo "    - {base_url: \"http://$host:$port/v1\"}"
done
