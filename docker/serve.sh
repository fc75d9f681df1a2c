#!/usr/bin/env bash
# Serve a model with vLLM through rocm-mla's attention backend: the entrypoint of docker/Dockerfile,
# usable outside the image too. Arguments are passed on to `vllm serve` after the ones below (for
# vLLM's argparse the later of two equal options wins, so they can override these).
#
# Environment (defaults in brackets):
#   MODEL                   model to serve [deepseek-ai/DeepSeek-V2-Lite-Chat]
#   TP                      --tensor-parallel-size [1]
#   HOST, PORT              where to listen [0.0.0.0, 8000]
#   ATTENTION_BACKEND       --attention-backend [ROCM_MLA]; empty: let vLLM choose
#   MAX_MODEL_LEN           --max-model-len [empty: the model's own]
#   GPU_MEMORY_UTILIZATION  --gpu-memory-utilization [0.9]
#   TRUST_REMOTE_CODE       1: --trust-remote-code [0: only the model code vLLM ships runs]
#   VLLM_EXTRA_ARGS         more `vllm serve` arguments, split on whitespace [none]
#   ROCM_MLA_PLUGIN         rocm-mla's entry-point name in vllm.general_plugins [rocm_mla]
#   VLLM_PLUGINS            vLLM's plugin allow-list: left unset when unset (vLLM then loads every
#                           installed plugin, rocm-mla's among them); ROCM_MLA_PLUGIN is appended
#                           when a list without it is given
#   ROCM_MLA_FUSE_ROPE_KV   1: with ATTENTION_BACKEND=ROCM_MLA, turn on vLLM's fuse_rope_kvcache_cat_mla
#                           compile pass, so that RoPE + the latent KV-cache write run as one
#                           rocm_mla kernel (rocm_mla/vllm/fused_rope_kv_op.py) [1]. It adds
#                           -cc.use_inductor_graph_partition=true (the KV update stops being a
#                           splitting op, so RoPE and the update share one Inductor graph) and
#                           -cc.pass_config.fuse_rope_kvcache_cat_mla=true (vLLM 0.33 turns the pass
#                           on by itself at -O2/-O3 once the first holds; explicit here).
#                           0: neither flag; vLLM's default (-O2: pass off, RoPE in torch, then the
#                           ROCM_MLA KV write). When the arguments carry a JSON --compilation-config
#                           / -cc (vLLM drops such a JSON when dotted -cc.* flags are also given),
#                           the two keys are merged into that JSON instead (its own values win).
#                           No effect with --enforce-eager or -O0 (nothing is compiled).
#   ROCM_MLA_EXPECT_VLLM    vLLM version prefixes rocm-mla is written for, comma-separated
#                           [0.34.,0.33.]; empty: any
#   ROCM_MLA_SERVE_CHECK_ONLY=1  run the start-up checks and exit (the image build does this)
#   DRY_RUN=1               print the command instead of running it (no checks)
set -euo pipefail

MODEL=${MODEL:-deepseek-ai/DeepSeek-V2-Lite-Chat}
TP=${TP:-1}
HOST=${HOST:-0.0.0.0}
PORT=${PORT:-8000}
ATTENTION_BACKEND=${ATTENTION_BACKEND-ROCM_MLA}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.9}
TRUST_REMOTE_CODE=${TRUST_REMOTE_CODE:-0}
ROCM_MLA_PLUGIN=${ROCM_MLA_PLUGIN:-rocm_mla}
ROCM_MLA_EXPECT_VLLM=${ROCM_MLA_EXPECT_VLLM-0.34.,0.33.}
ROCM_MLA_FUSE_ROPE_KV=${ROCM_MLA_FUSE_ROPE_KV:-1}

# vLLM loads every general plugin when VLLM_PLUGINS is unset (ours among them: left so, other
# plugins keep working) and only the listed ones when it is set: a list given without ours would
# leave ROCM_MLA unregistered, and vLLM would then reject --attention-backend ROCM_MLA.
if [[ -n ${VLLM_PLUGINS+set} && ",$VLLM_PLUGINS," != *",$ROCM_MLA_PLUGIN,"* ]]; then
  VLLM_PLUGINS=${VLLM_PLUGINS:+$VLLM_PLUGINS,}$ROCM_MLA_PLUGIN
  export VLLM_PLUGINS
fi

cmd=(vllm serve "$MODEL" --tensor-parallel-size "$TP" --host "$HOST" --port "$PORT"
     --gpu-memory-utilization "$GPU_MEMORY_UTILIZATION")
[[ -n $ATTENTION_BACKEND ]] && cmd+=(--attention-backend "$ATTENTION_BACKEND")
[[ -n $MAX_MODEL_LEN ]] && cmd+=(--max-model-len "$MAX_MODEL_LEN")
[[ $TRUST_REMOTE_CODE == 1 ]] && cmd+=(--trust-remote-code)
read -r -a extra <<< "${VLLM_EXTRA_ARGS:-}"
# The fused RoPE + KV write (flags checked against vLLM 0.33: config/compilation.py PassConfig,
# config/vllm.py enable_rope_kvcache_mla_fusion, and its CLI's -cc.* parsing; see the header).
# A JSON compilation config given by the user (AMD's recipes pass one) gets the two keys merged in
# (its own values win): vLLM drops such a JSON when dotted -cc.* flags come too.
merge_cc() {  # merge_cc JSON: the JSON with the fusion keys added; the JSON unchanged if not an object
  python3 -c '
import json, sys
try:
    d = json.loads(sys.argv[1])
except ValueError:
    d = None
if not isinstance(d, dict):
    print(sys.argv[1]); sys.exit(3)
d.setdefault("use_inductor_graph_partition", True)
d.setdefault("pass_config", {}).setdefault("fuse_rope_kvcache_cat_mla", True)
print(json.dumps(d))' "$1"
}
fuse=()
args=("${extra[@]}" "$@")
if [[ $ROCM_MLA_FUSE_ROPE_KV == 1 && $ATTENTION_BACKEND == ROCM_MLA ]]; then
  json_cc=0
  for i in "${!args[@]}"; do
    a=${args[$i]}
    case $a in
      --compilation-config | -cc)
        json_cc=1
        next=$((i + 1))
        if [[ $next -lt ${#args[@]} ]]; then
          args[next]=$(merge_cc "${args[$next]}") || echo "serve.sh: $a ${args[$next]} is not a JSON object:" \
            'add "use_inductor_graph_partition": true, "pass_config": {"fuse_rope_kvcache_cat_mla": true}' >&2
        fi ;;
      --compilation-config=* | -cc=*)
        json_cc=1
        args[i]="${a%%=*}=$(merge_cc "${a#*=}")" || echo "serve.sh: $a is not a JSON object:" \
          'add "use_inductor_graph_partition": true, "pass_config": {"fuse_rope_kvcache_cat_mla": true}' >&2 ;;
    esac
  done
  [[ $json_cc == 1 ]] || fuse=(-cc.use_inductor_graph_partition=true -cc.pass_config.fuse_rope_kvcache_cat_mla=true)
fi
cmd+=("${fuse[@]}" "${args[@]}")

if [[ ${DRY_RUN:-0} == 1 ]]; then
  echo "VLLM_PLUGINS=${VLLM_PLUGINS-(unset: every installed plugin)}"
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi

# Start-up checks: package metadata only (importing vllm here would initialise the GPU platform,
# which cannot happen at image build time). Each failure says what to do.
check() {
  python3 - "$ROCM_MLA_PLUGIN" "$ROCM_MLA_EXPECT_VLLM" "$ATTENTION_BACKEND" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, entry_points, version

plugin, expect, backend = sys.argv[1:4]
problems = []
try:
    v = version("vllm")
    prefixes = [p.strip() for p in expect.split(",") if p.strip()]
    if prefixes and not any(v.startswith(p) for p in prefixes):
        problems.append(f"vLLM {v} is installed; rocm-mla's backend is written for "
                        f"{' or '.join(p + 'x' for p in prefixes)} (set ROCM_MLA_EXPECT_VLLM= to skip this check)")
except PackageNotFoundError:
    problems.append("vLLM is not installed in this Python")
try:
    ours = version("rocm-mla")
except PackageNotFoundError:
    ours = None
    problems.append("rocm-mla is not installed (pip install --no-build-isolation --no-deps .)")
names = sorted(e.name for e in entry_points(group="vllm.general_plugins"))
if ours and plugin not in names:
    problems.append(f"no vllm.general_plugins entry point named {plugin!r} (found: {names or 'none'}); "
                    "ROCM_MLA_PLUGIN must name rocm-mla's entry point in pyproject.toml")
if problems:
    print("serve.sh: start-up check failed:", *problems, sep="\n  ", file=sys.stderr)
    sys.exit(1)
print(f"serve.sh: vLLM {v}, rocm-mla {ours}, plugin {plugin!r}, attention backend {backend or '(vLLM default)'}")
PY
}

check
if [[ ${ROCM_MLA_SERVE_CHECK_ONLY:-0} == 1 ]]; then
  exit 0
fi
echo "VLLM_PLUGINS=${VLLM_PLUGINS-(unset: every installed plugin)}"
printf '%q ' "${cmd[@]}"
echo
exec "${cmd[@]}"
