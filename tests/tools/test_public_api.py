"""The package's face: every attention op comes with its plan function, its tensor planner and its
plan type, all exported at the top level and listed in the module docstring, and every op takes the
one contract's keywords (no knob on the call: knobs live in the plan)."""

from __future__ import annotations

import dataclasses
import inspect

import rocm_mla
import rocm_mla.ops as ops

# op -> (plan function, plan type): the attention ops of the one contract.
ATTENTION_OPS = {
    "mla_decode": ("plan_decode", "DecodePlan"),
    "mla_prefill": ("plan_prefill", "PrefillPlan"),
    "mla_prefill_with_context": ("plan_prefill_with_context", "PrefillContextPlan"),
    "mla_sparse_attention": ("plan_sparse_attention", "SparsePlan"),
    "mla_indexer_topk": ("plan_indexer_topk", "IndexerTopkPlan"),
}
# The keyword-only arguments an attention op may take: the contract's (its outputs: out, lse, and the
# indexer's candidate blocks, a second output as lse is attention's), plus the sizes that are part of
# the question asked (the softmax scale; the indexer's topk).
CONTRACT_KEYWORDS = ("topk", "sm_scale", "out", "lse", "candidates_out", "k_scale", "workspace", "plan")


def test_every_public_op_name_is_exported_at_the_top_level_and_in_the_docstring():
    for name in ops.__all__:
        if name == "mla_decode_workspace_numel":  # a sizing helper of rocm_mla.ops, not an op
            continue
        assert name in rocm_mla.__all__, name
        assert getattr(rocm_mla, name) is getattr(ops, name), name
        assert name in rocm_mla.__doc__, f"{name} missing from rocm_mla's docstring"


def test_every_attention_op_has_its_plan_function_planner_and_frozen_plan_type():
    for op, (plan_fn, plan_type) in ATTENTION_OPS.items():
        for name in (op, plan_fn, f"{plan_fn}_for", plan_type):
            assert name in rocm_mla.__all__, name
        kind = getattr(rocm_mla, plan_type)
        assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen, plan_type
        assert callable(getattr(kind, "matches", None)), f"{plan_type}.matches"


def test_attention_ops_take_no_knob_on_the_call():
    for op in ATTENTION_OPS:
        params = inspect.signature(getattr(rocm_mla, op)).parameters.values()
        keywords = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
        assert keywords <= set(CONTRACT_KEYWORDS), (
            f"{op} takes {sorted(keywords - set(CONTRACT_KEYWORDS))} beside the plan"
        )
        assert "plan" in keywords, op
        order = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
        assert order == [k for k in CONTRACT_KEYWORDS if k in keywords], f"{op}: keywords in the order {order}"
