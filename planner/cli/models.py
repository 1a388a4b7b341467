"""CLI commands: ``topoplan models list`` and ``topoplan models show NAME|config.json [--json]``."""

from __future__ import annotations

import json

import typer

from planner.model.flops import flops_terms, param_counts
from planner.model.spec import catalog, load_model

models_app = typer.Typer(
    name="models",
    help="The built-in model catalog and any Hugging Face config.json.\n\n"
    "Example: topoplan models show deepseek-v3",
    no_args_is_help=True,
    rich_markup_mode=None,  # click's plain help: no truncated option names
)


def _facts(name_or_path: str, seq_len: int) -> dict:
    m = load_model(name_or_path)
    pc = param_counts(m)
    terms = flops_terms(m, seq_len)
    return {
        "name": m.name,
        "family": m.family,
        "params_total": pc.total,
        "params_active": pc.active,
        "params_active_without_embedding": pc.active_without_embedding,
        "params_active_non_embedding": pc.active_non_embedding,
        "params_mtp": pc.mtp,
        "seq_len": seq_len,
        "gflop_per_token": round(terms["total"], 4),
        "gflop_terms": {k: round(v, 4) for k, v in terms.items() if k not in ("total", "padded_vocab")},
        "padded_vocab_tp1": terms["padded_vocab"],
        "spec": m.model_dump(mode="json"),
    }


def _b(n: int) -> str:
    return f"{n / 1e9:,.2f}B"


def _b1(n: int) -> str:
    return f"{n / 1e9:,.1f}B"


def list_models(json_out: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """List the built-in models with their size and GFLOP/token at seq 4096.

    Example: topoplan models list
    """
    rows = [_facts(n, 4096) for n in catalog()]
    if json_out:
        keys = ("name", "family", "params_total", "params_active", "params_active_without_embedding", "gflop_per_token")
        print(json.dumps([{k: r[k] for k in keys} for r in rows], indent=2))
        return
    head = (f"{'name':16s} {'family':11s} {'layers':>6s} {'attn':4s} {'experts':>9s} {'total':>8s} {'active':>7s} "
            f"{'GFLOP/tok':>9s}")
    print(head)
    for r in rows:
        s = r["spec"]
        exp = f"{s['num_experts']}/top{s['top_k']}" if s["num_experts"] else "dense"
        print(
            f"{r['name']:16s} {r['family']:11s} {s['num_layers']:6d} {s['attention']:4s} {exp:>9s} "
            f"{_b1(r['params_total']):>8s} {_b1(r['params_active']):>7s} {r['gflop_per_token']:9.2f}"
        )
    print("active: with embeddings (DeepSeek's and Meta's convention); models show gives the others.")
    print("GFLOP/token: Megatron-Bridge training FLOPs per token at seq 4096, TP1")


def show_model(
    model: str = typer.Argument(..., help="catalog name (topoplan models list) or a config.json path"),
    seq_len: int = typer.Option(4096, "--seq-len", min=1, help="sequence length for the FLOP count"),
    json_out: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Show one model's spec, parameter counts and Megatron-Bridge GFLOP/token.

    Example: topoplan models show deepseek-v3 --json ; topoplan models show ./my-model/config.json
    """
    f = _facts(model, seq_len)
    if json_out:
        print(json.dumps(f, indent=2))
        return
    s = f["spec"]
    lines = [
        f"{f['name']}  ({f['family']})",
        f"  layers            {s['num_layers']} decoder" + (f" + {s['mtp_layers']} MTP" if s["mtp_layers"] else ""),
        f"  hidden            {s['hidden_size']}",
    ]
    if s["attention"] == "mla":
        lines.append(
            f"  attention         MLA, {s['num_attention_heads']} heads, q_lora {s['q_lora_rank']}, kv_lora {s['kv_lora_rank']}, "
            f"qk {s['qk_nope_head_dim']}+{s['qk_rope_head_dim']}, v {s['v_head_dim']}"
        )
    else:
        lines.append(f"  attention         {s['num_attention_heads']} heads, {s['num_kv_heads']} KV heads, head_dim {s['head_dim']}")
    if s["sliding_window"]:
        lines.append(f"  sliding window    {s['sliding_window']} on {sum(s['swa_layers'])} of {s['num_layers']} layers")
    lines += _mixer_lines(s)
    dense = sum(1 for e, m in zip(s["moe_layers"], s["mlp_layers"]) if m and not e)
    if s["num_experts"]:
        moe = sum(s["moe_layers"])
        lines.append(
            f"  experts           {s['num_experts']} x {s['moe_ffn_hidden_size']}, top-{s['top_k']}"
            + (f", shared {s['shared_ffn_hidden_size']}" if s["shared_ffn_hidden_size"] else "")
            + (f", groups {s['topk_group']}/{s['n_group']}" if s["n_group"] > 1 else "")
            + f"; {moe} MoE + {dense} dense layers"
        )
    if dense:
        lines.append(f"  dense MLP         {s['ffn_hidden_size']} ({'gated' if s['gated_mlp'] else 'plain'}, {s['activation']})")
    lines += [
        f"  vocab             {s['vocab_size']} (padded {f['padded_vocab_tp1']} at TP1), "
        + ("tied" if s["tied_embeddings"] else "untied") + " embeddings",
        f"  params            {_b(f['params_total'])} total" + (f", MTP {_b(f['params_mtp'])} more" if f["params_mtp"] else ""),
        f"  active per token  {_b(f['params_active'])} with embeddings, "
        f"{_b(f['params_active_without_embedding'])} without the input embedding, "
        f"{_b(f['params_active_non_embedding'])} without either",
        f"  GFLOP/token       {f['gflop_per_token']:.2f} at seq {seq_len}  ("
        + ", ".join(f"{k} {v:.2f}" for k, v in f["gflop_terms"].items())
        + ")",
    ]
    print("\n".join(lines))


def _mixer_lines(s: dict) -> list[str]:
    """The hybrid mixers (planner.model.mixers): which layers mix tokens how, and their widths."""
    out = []
    counts = {x: s["mixers"].count(x) for x in ("attention", "gdn", "mamba", "none")}
    if counts["attention"] != s["num_layers"]:
        names = {"attention": "attention", "gdn": "Gated DeltaNet", "mamba": "Mamba-2", "none": "MLP-only"}
        out.append("  mixers            " + ", ".join(f"{n} {names[x]}" for x, n in counts.items() if n)
                   + (f"; {s['mlp_layers'].count(False)} mixer-only" if False in s["mlp_layers"] else ""))
    if s.get("gdn"):
        g = s["gdn"]
        out.append(f"  gated deltanet    {g['num_key_heads']}x{g['key_head_dim']} q/k, {g['num_value_heads']}x"
                   f"{g['value_head_dim']} v, conv {g['conv_kernel']}")
    if s.get("mamba"):
        m = s["mamba"]
        out.append(f"  mamba-2           {m['num_heads']}x{m['head_dim']} heads, state {m['state_size']}, "
                   f"{m['n_groups']} groups, conv {m['conv_kernel']}")
    if s.get("dsa"):
        d = s["dsa"]
        out.append(f"  sparse attention  top-{d['topk']} keys; indexer {d['n_heads']}x{d['head_dim']}")
    return out


models_app.command("list")(list_models)
models_app.command("show")(show_model)


def register(app: typer.Typer) -> None:
    """Add ``models list`` and ``models show`` to the root app."""
    app.add_typer(models_app, name="models")
