"""``rocm-mla tune``: measure the launch configs of every op on this GPU and keep what is faster.

    rocm-mla tune [--ops decode,prefill,merge,rope_kv_write,sparse,indexer,v4] [--shapes PRESET|LIST] [--quick]
                  [--max-minutes M] [--max-candidates K] [--out PATH]
    rocm-mla tune --check [--stamp] [--out PATH]      # validate (and accept) an overlay
    rocm-mla tune --show [--retime] [--out PATH]      # what the active overlay changes, its table
    rocm-mla tune --list-shapes [--shapes ...]

For each op the tuner splits the shapes into groups that one part of the op's config serves (a
decode tier for 16-bit or fp8 caches, an ``mla_sparse_attention`` tier for 16-bit or fp8 caches or
float32 q, prefill's first tier for 16-bit or float32 inputs, the merge / RoPE+KV-write
implementation the op dispatches to, ``mla_indexer_topk``'s one tier, an ``mla_v4_attention`` tier
for 16-bit or float32 q), times the default and the candidates of each group on every shape of
the group, and keeps a winner only when

* its output matched the float32 reference on every shape (every candidate is checked before it
  is timed: a subset of rows of the timed call, under the op's ``rocm_mla.cases`` tolerance; the
  indexer's answer must be a valid top-k of float64 logits; v4's rows the float64 reference's);
* it is at least 1% faster than the default over the group (geometric mean) and, timed again back
  to back with the default (alternating, median of 3), slower on no shape of the group: the
  default is always a candidate and wins ties;
* every config it changes compiles and passes the reference for the other dtypes it serves
  (the ``verify`` shapes of ``rocm_mla.cases``; the same check as ``--check``).

Candidates come from the configs alone: each arch object's ``candidates`` (``mla_decode``,
``mla_sparse_attention`` and ``mla_v4_attention``: its tiers too, those whose BLOCK_H fits;
merge's and RoPE's HIP kernel: ``hip.candidates``), then one coordinate-search pass over the
arch's knobs (block sizes, warps,
stages, D_SPLIT, V_SPLIT, ctas_per_cu, CLAMP_PAGES, for fp8 caches RELOAD_K and, on NVIDIA with a
bf16 q, F16_DOT, and on gfx9 waves_per_eu, matrix_instr_nonkdim, kpack; the fields merge's and
RoPE's candidates vary; the decode, sparse and v4 split cost models and decode's reduce tile).
A tier group's winner changes that one kind of call: the other kinds the tier serves keep their
configs (restated in its ``fp8`` / ``fp32`` objects where needed). ``mla_indexer_topk``: one group
over all its shapes whose candidates are whole launch configs, the tier and its single-field
changes the configs list, but those the plan launches alike (it raises split_keys and chunk to one
element a thread): 14 with the default on sm90, 13 on gfx942 and gfx950; no coordinate pass.
``--quick`` instead caps the candidates per group (the default included: decode 3, sparse 3,
prefill 4, merge 12, RoPE 33, indexer 4, v4 3): listed ones first, then single-knob neighbours of the
default; on the ``quick`` shape preset.

Timing as perf/ does: decode, sparse, the indexer and v4 as back-to-back replays of CUDA/HIP graphs of
8 calls rotating over cache copies larger than the caches (each replay reads its KV from HBM; the
indexer with a plan made once per config and its workspace allocated with it); the others
as one captured call replayed under ``do_bench`` with L2 flushed before each replay. Ops are called
through their public entry points exactly as a serving process calls them; the candidate reaches
them through ``rocm_mla.configs.override`` (the same path an overlay takes).

The result is a config overlay (``rocm_mla/configs``: ``<arch>-<CUs>cu.json`` in
``$ROCM_MLA_CONFIG_DIR``, default ``~/.config/rocm_mla``; or ``--out PATH``), written after every
accepted group (``--max-minutes`` stops early and keeps what was accepted), with a ``_meta``
object: date, device, CU count, versions, and the default and tuned time of every shape. Processes
started afterwards use it; ``rocm-mla doctor`` shows what it changes.

On a machine without a GPU the tuner refuses to run unless ``--allow-cpu``: the Triton kernels
then run in the CPU interpreter and the "times" are interpreter wall times that say nothing about
any GPU (the mode exists to test the tuner itself, with ``--shapes tiny``).

The inputs, the shape sets and the checks are ``rocm_mla.cases``'s (one builder and one tolerance
per op, shared with the tests, the doctor and the benches). The package: ``shapes`` (Shape,
PRESETS: named cases shape sets, parse_shapes), ``inputs`` (a cases input object as the tuner's
timed and checked call, and the small verification call), ``groups`` (which part of a config
serves which shapes, and its candidates), ``timing`` (the timer), ``acceptance`` (the rules a
winner passes: MIN_GAIN, the re-time, verify), ``tuner`` (the search loop), ``overlay`` (writing
and describing the overlay, the result table) and ``cli`` (``rocm-mla tune``, ``--check``,
``--show``).
"""
