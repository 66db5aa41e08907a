"""The inventory of the kernels' and layers' numerical safeguards, found in the sources by their markers.

Each safeguard is one line of `fla_lab/ops` or `fla_lab/layers` whose naive form computes the same number in exact
arithmetic but not in floating point. The line carries the marker `# safeguard: <id>` (`fla_lab.spec.markers`: at
its end, or on a comment line of its own above it). `REGISTRY` names it by that id and holds its naive form (the
code that replaces the marked line's code, its indentation kept: what the mutation check and notebook 06's removal
put in), what it protects against, the ops that run it and the tests that fail with the naive form; the shipped
line itself is read from the source. `inventory()` finds each entry's file, line and enclosing function through its
marker, without importing the kernels.

Entries with `bug` are catalogued bugs (`python -m fla_lab bugs`): their naive form is the bug switch's helper,
tested through that switch; entries with `mutation` are reverted by an existing mutation of the mutation check. The
others are reverted by a mutation of their own id (`mutations()`, used by `dev/mutation_check.py`).

    python -m fla_lab safeguards [--write]  # the table (Markdown); --write: into docs/onboarding.md
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fla_lab.spec import markers

ROOT = Path(__file__).resolve().parents[2]
PROTECTS = ("overflow", "cancellation", "inf-inf", "0*inf", "precision", "padded rows")
TESTS = "tests/test_safeguards.py"


@dataclass(frozen=True)
class Safeguard:
    id: str          # the id of its marker, `# safeguard: <id>`
    naive: str       # the code that replaces the marked line's code in the naive form
    protects: str    # one of PROTECTS
    ops: tuple
    what: str
    tests: tuple = ()  # pytest node ids that fail with the naive form (default: test_<id> of tests/test_safeguards.py)
    bug: str | None = None       # "op:bug" when the naive form is a catalogued bug switch
    mutation: str | None = None  # an existing mutation check id that reverts it
    # where it matters, as keyword arguments of `atlas.settings` for its ops (decays, q_scales, lengths, dtypes);
    # None: a layer's line, upstream of every op (the atlas and the audit see its output as the op's input)
    atlas: dict | None = None
    gpu_only: bool = False  # its naive form differs only in compiled code (16-bit or TF32 dots): its test needs CUDA

    def catching_tests(self) -> tuple:
        return self.tests or (f"{TESTS}::test_{self.id}",)


@dataclass(frozen=True)
class Entry:
    guard: Safeguard
    path: str      # relative to the repository root
    line: int
    function: str  # the enclosing function: the Triton kernel or helper, or the layer's method


CHUNK_OPS = ("chunk_gla", "chunk_rwkv6", "chunk_gsa")
ALL_CHUNK_OPS = (*CHUNK_OPS, "chunk_rwkv7")
GSA_OPS = ("chunk_gsa", "fused_recurrent_gsa")
STRONG_DECAY = {"decays": (100.0,)}     # a chunk's cumulative log-decay far past exp's 88
LARGE_LOGITS = {"q_scales": (100.0,)}   # GSA's slot logits far from zero
# fp16 inputs at decays whose cumulative sums fp16 rounds visibly (tl.cumsum promotes bf16 to fp32, not fp16)
FP16 = {"dtypes": ("fp16",), "decays": (1.0, 10.0)}
BF16_LARGE_LOGITS = {"dtypes": ("bf16",), "q_scales": (100.0,)}  # slot logits far from zero, bf16 inputs
FP32_DOTS = {"dtypes": ("fp32",)}       # fp32 inputs on a GPU, where a dot may run in TF32 (the interpreter: IEEE)
# bf16 on a GPU at training length and weak decay (tests/test_training_length.py); the interpreter's dots are fp32
TRAINING_LENGTH = {"dtypes": ("bf16",), "lengths": (4096,), "decays": (0.001,)}


def one_exponent(id: str, naive: str, ops: tuple, what: str) -> Safeguard:
    """A decay factor taken as one exponent G_later - G_earlier <= 0, whose naive form splits it in two,
    exp(G_later) * exp(-G_earlier): 0 * inf once a cumulative log-decay passes -88 (the atlas's strong decay)."""
    what = f"{what}: one exponent <= 0, not exp(G_later) * exp(-G_earlier)"
    return Safeguard(id, naive, "0*inf", ops, what, atlas=STRONG_DECAY)


def rounding(id: str, naive: str, ops: tuple, atlas: dict, what: str, gpu_only: bool = False) -> Safeguard:
    """A value kept in fp32, or a product at fp32's accuracy, where the naive form rounds to 16 bits (or TF32)."""
    return Safeguard(id, naive, "precision", ops, what, atlas=atlas, gpu_only=gpu_only)


REGISTRY = (
    Safeguard("gsa_softmax_max_first", 'b_x = tl.where(m, b_x, float("-inf"))', "overflow", ("chunk_gsa",),
              "slot softmax: the row maximum is subtracted before exp (exp(x) overflows for logits above 88)",
              atlas=LARGE_LOGITS),
    Safeguard("gsa_softmax_bwd_max_first", 'b_x = tl.where(m, b_x, float("-inf"))', "overflow", ("chunk_gsa",),
              "slot softmax backward: the recomputed probabilities subtract the row maximum before exp",
              atlas=LARGE_LOGITS),
    Safeguard("state_key_decay_to_chunk_end", "b_kt *= tl.exp(b_glast[:, None]) * tl.exp(-b_gt)", "0*inf", CHUNK_OPS,
              "state pass, key side: one exponent G_last - G_t <= 0, not exp(G_last) * exp(-G_t) (0 * inf once "
              "a chunk's decay passes 88)",
              atlas=STRONG_DECAY),
    Safeguard("state_value_decay_to_chunk_end", "b_v *= tl.exp(b_glast[None, :]) * tl.exp(-b_g)", "0*inf",
              ("chunk_gsa",),
              "state pass, value side (GSA's keys -> slots): the same single exponent G_last - G_t <= 0",
              atlas=STRONG_DECAY),
    Safeguard("rwkv7_state_decay_to_chunk_end",
              "b_gend = tl.exp(b_glast[:, None]) * tl.exp(-load_cols(gi, o_t, o_k, m_kt, HK))", "0*inf",
              ("chunk_rwkv7",),
              "RWKV-7 state pass: b and k decayed to the chunk end with one exponent G_last - G_t <= 0",
              atlas=STRONG_DECAY),
    Safeguard("gla_dk_decay_to_chunk_end", "b_dk += b_dkh * tl.exp(b_glast[None, :]) * tl.exp(-b_gk)", "0*inf",
              ("chunk_gla", "chunk_rwkv6"),
              "dk's state term: one exponent G_last - G_t <= 0, not exp(G_last) * exp(-G_t)",
              atlas=STRONG_DECAY),
    Safeguard("rwkv7_reader_weight_masked_before_exp", "b_w = tl.exp(b_g - b_gj[None, :]) * causal.to(tl.float32)",
              "0*inf", ("chunk_rwkv7",),
              "RWKV-7 backward, dr and da: the exponent is masked before exp (pairs s > t: exp(+large) * 0)",
              atlas=STRONG_DECAY),
    Safeguard("rwkv7_writer_weight_masked_before_exp", "b_w = tl.exp(b_gj[None, :] - b_g) * causal.to(tl.float32)",
              "0*inf", ("chunk_rwkv7",),
              "RWKV-7 backward, db and dk: the exponent is masked before exp",
              atlas=STRONG_DECAY),
    Safeguard("gsa_dv_state_decay_to_chunk_end", "b_out = b_xh * tl.exp(b_glast[None, :]) * tl.exp(-b_g)", "0*inf",
              ("chunk_gsa",),
              "GSA backward, the state term of a slot pass's dv: one exponent G_last - G_t <= 0",
              atlas=STRONG_DECAY),
    Safeguard("plain_rows_decay_to_chunk_end", "b_y *= tl.exp(b_glast[None, :]) * tl.exp(-b_g)", "0*inf", CHUNK_OPS,
              "backward rows decayed to the chunk end (GLA's dv, GSA's dk): one exponent G_last - G_t <= 0",
              atlas=STRONG_DECAY),
    Safeguard("gsa_gate_logsigmoid", "f = torch.log(torch.sigmoid(x)) / self.gate_logit_normalizer", "overflow",
              ("chunk_gsa",),
              "GSA layer's forget gate: logsigmoid, not log(sigmoid(x)) (sigmoid underflows to 0 below -88: "
              "log gives -inf)"),
    Safeguard("gsa_write_expm1", "return f, 1 - torch.exp(f)", "cancellation", ("chunk_gsa",),
              "GSA layer's slot write 1 - exp(f) as -expm1(f): small writes are not rounded to 0"),
    Safeguard("gsa_gate_fp32", "x = self.f_proj(hidden_states)", "precision", ("chunk_gsa",),
              "GSA layer's gates computed in fp32 from a bf16 projection (upstream #181's lesson)"),
    Safeguard("rwkv6_decay_fp32", "w_raw = self.w_lora(xw)", "precision", ("chunk_rwkv6", "fused_recurrent_rwkv6"),
              "RWKV6 layer's log-decay -exp(w_raw) computed in fp32 from a bf16 LoRA output"),
    Safeguard("gla_diagonal_masked_before_exp", "return tl.exp(b_gq - b_gk) * causal.to(tl.float32)", "0*inf",
              ("chunk_gla", "chunk_gsa"),
              "diagonal blocks: the exponent is masked before exp, so pairs above the diagonal give 0, not inf * 0",
              tests=("tests/test_chunk.py::test_chunk_gla[B1-T64-H1-K64-V64-float16-m10-h0-c64]",),
              mutation="gla_diag_mask_after_exp",
              atlas=STRONG_DECAY),
    Safeguard("gsa_later_rows_masked", "return b_gq - b_gn", "padded rows", ("chunk_gsa", "chunk_gla", "chunk_rwkv6"),
              "rows past T (loaded as 0) are masked in the exponent: exp(0 - gn) would overflow and meet a zero",
              tests=("tests/test_gsa.py::test_unmasked_padding_gives_nan_in_ds_and_dg_with_a_partial_last_chunk",
                     "tests/test_gsa.py::test_fixed_path_is_finite_where_the_bug_fires"),
              bug="chunk_gsa:unmasked_padding",
              atlas=STRONG_DECAY),
    Safeguard("reference_row_exclusive", "return gi + i_start * HK + o_k", "0*inf", ("chunk_rwkv6", "chunk_gla"),
              "sub-chunk reference row gi[start - 1]: both factors exp(gq - gn) and exp(gn - gk) stay <= 1",
              tests=("tests/test_lesson_overflow.py::test_buggy_kernel_fails_exactly_where_the_reference_row_is_used",
                     "tests/test_lesson_overflow.py::test_fixed_kernel_matches_the_spec_at_extreme_decay"),
              bug="chunk_rwkv6:exclusive_reference",
              atlas=STRONG_DECAY),
    Safeguard("rwkv7_decay_fp32", "return -DECAY_SCALE * w_raw.sigmoid()", "precision",
              ("chunk_rwkv7", "fused_recurrent_rwkv7"),
              "RWKV-7 layer's log-decay in fp32 (the fix of upstream #181)",
              tests=("tests/test_layers_autocast.py::"
                     "test_bf16_decay_switch_rounds_the_decay_inside_a_real_autocast_step",),
              bug="rwkv7:bf16_decay"),
    # a decay factor as one exponent around the sub-chunks' reference row gn, or per pair
    one_exponent("earlier_rows_key_decay", "b_acc += mma(b_s, b_y * tl.exp(b_gn[None, :]) * tl.exp(-b_gj), DOT)",
                 CHUNK_OPS, "rows from earlier sub-chunks (GLA's dq, GSA's slot output), key factor exp(gn - G_s)"),
    one_exponent("earlier_rows_query_decay", "b_acc *= tl.exp(b_gq) * tl.exp(-b_gn[None, :])", CHUNK_OPS,
                 "rows from earlier sub-chunks, query factor exp(G_t - gn)"),
    one_exponent("later_rows_key_decay", "b_acc *= tl.exp(b_gn[None, :]) * tl.exp(-b_gk)", CHUNK_OPS,
                 "columns from later sub-chunks (GLA's dk, GSA's slot dv), key factor exp(gn - G_s)"),
    one_exponent("later_rows_query_decay", "b_acc += mma(b_st, b_w * tl.exp(b_gq) * tl.exp(-b_gn[None, :]), DOT)",
                 CHUNK_OPS,
                 "columns from later sub-chunks, the later rows' factor exp(G_t - gn) (the EXPONENT helper, which "
                 "also masks rows past T)"),
    one_exponent("gated_scores_query_decay", "b_qg = b_q * tl.exp(b_gq) * tl.exp(-b_gn[None, :])", CHUNK_OPS,
                 "intra-chunk scores, a block of an earlier key sub-chunk, query factor exp(gq - gn)"),
    one_exponent("gated_scores_key_decay", "b_A += mma(b_qg, b_kt * tl.exp(b_gn[:, None]) * tl.exp(-b_gkt), DOT)",
                 CHUNK_OPS, "intra-chunk scores, a block of an earlier key sub-chunk, key factor exp(gn - gk)"),
    one_exponent("folded_diagonal_decay", "b_a += tl.sum(b_q * b_k * tl.exp(b_gq) * tl.exp(-b_gk), axis=1)",
                 CHUNK_OPS,
                 "intra-chunk scores, diagonal block, each pair's exp(G_t - G_s) (both the chunk's cumulative "
                 "decays, far past -88 in a late sub-chunk)"),
    Safeguard("rwkv6_diagonal_masked_before_exp",
              "return tl.where(diag, b_u, tl.exp(b_gq - b_gk) * below.to(tl.float32))", "0*inf", ("chunk_rwkv6",),
              "RWKV6's diagonal blocks (backward): the exponent masked before exp, so pairs s > t, where "
              "G_{t-1} - G_s >= 0, give 0, not inf * 0",
              atlas=STRONG_DECAY),
    one_exponent("gsa_slot_diagonal_decay", "b_e = tl.exp(b_g) * tl.exp(-b_gj[None, :])", ("chunk_gsa",),
                 "GSA's slot output, diagonal block, each pair's exp(G_t - G_j)"),
    # the first line of a two-line statement, whose second line (`- G_s, 0))`) stays: exp(G_t) * exp(0 - G_s)
    one_exponent("rwkv7_pair_weight_decay",
                 "b_w = tl.exp(tl.load(gi + rows_t[:, None] * HK + o_k[None, :], mask=m, other=0)) * "
                 "tl.exp(tl.where(m, 0", ("chunk_rwkv7",),
                 "RWKV-7's four scores, the weight exp(G_t - G_s) of each pair and channel"),
    # the slot softmax's padded slots (M not a power of two), fp32 slot scores, ABC's gates
    *(Safeguard(f"gsa_softmax{kernel}_pad_neg_inf", f"b_x = tl.load({pointer}, mask=m, other=0).to(tl.float32)",
                "padded rows", GSA_OPS,
                f"slot softmax{what}: padded slots (M below its power of two) load -inf, so the row maximum is a "
                "real logit's; with 0 a row of logits all below -88 subtracts 0 and exp underflows to a 0 / 0 row")
      for kernel, pointer, what in (("", "x + o_r[:, None] * M + o_m[None, :]", ""),
                                    ("_bwd", "x + p_rm", " backward (the probabilities recomputed)"))),
    rounding("gsa_slot_scores_fp32", "o = torch.empty(B, T, H, V, dtype=q.dtype, device=q.device)", ("chunk_gsa",),
             BF16_LARGE_LOGITS,
             "GSA's slot scores (pass 1's output) kept fp32 for the softmax: in bf16 a logit of 30 is rounded by up "
             "to 0.06, and the slot weights move by up to 6%"),
    # the last line of a call: its other arguments stay
    rounding("gsa_fused_slot_scores_fp32", "o_dtype=q.dtype, seqs=seqs)", ("fused_recurrent_gsa",), BF16_LARGE_LOGITS,
             "fused GSA's slot scores (pass 1's output) kept fp32 for the softmax, as the chunked op's"),
    Safeguard("abc_gates_logcumsumexp", "z = s.float().exp().cumsum(1).log()", "overflow", GSA_OPS,
              "ABC's gates (g=None): the running normaliser as a log-cumulative-sum-exp, not log(cumsum(exp(s))) "
              "(exp overflows for slot writes above 88: inf - inf in the log-decay)"),
    Safeguard("abc_gates_fp32", "z = s.logcumsumexp(1)", "cancellation", GSA_OPS,
              "ABC's gates: the normaliser z in fp32, whose log-decay z_{t-1} - z_t subtracts two nearly equal "
              "values (a bf16 z of 4 is rounded by up to 0.016, as large as a late step's decay)"),
    # fp32 where a 16-bit form rounds
    rounding("chunk_cumsum_fp32", "b_g = tl.load(g + p, mask=m, other=0)", ALL_CHUNK_OPS, FP16,
             "the chunk's cumulative log-decay summed in fp32: an fp16 g summed in fp16 rounds G by 2^-11 of its size "
             "at every row (tl.cumsum promotes bf16 only)"),
    rounding("state_products_split", 'return tl.dot(a, b_hi, input_precision="ieee")',
             ("chunk_gsa", "chunk_gla", "chunk_rwkv6", "chunk_rwkv7"), TRAINING_LENGTH,
             "products with an fp32 state in 16-bit dots take the state as hi + lo halves, not one rounding "
             "(GPU only: the interpreter's dots are fp32); the rounding reaches dg", gpu_only=True),
    rounding("gsa_state_pass_split", "b_h = b_h * tl.exp(b_glast)[None, :] + mma(b_kt, b_v, DOT)", ("chunk_gsa",),
             TRAINING_LENGTH,
             "GSA's slot pass (value-side state) splits its decayed operand: the slot softmax magnifies one bf16 "
             "rounding per term of h into dg at weak decay (GPU only)", gpu_only=True),
    rounding("dot_precision_ieee", "return tl.dot(a.to(DOT), b.to(DOT))", ALL_CHUNK_OPS, FP32_DOTS,
             'fp32 dots in IEEE fp32 (input_precision="ieee"), not the default of tl.dot, TF32 on a GPU (10 mantissa '
             "bits; GPU only)",
             gpu_only=True),
    rounding("rwkv7_solve_tf32x3", "return tl.dot(x, y)", ("chunk_rwkv7",), FP32_DOTS,
             "RWKV-7's fp32 chunk products (the solve's, W, U0) at SOLVE_PRECISION, three TF32 products on a GPU, "
             "about fp32's accuracy, not tl.dot's default, one TF32 product (GPU only)", gpu_only=True),
    Safeguard("rwkv7_key_norm_eps",
              "kk = split_heads(k * self.k_k, self.head_dim); kk = kk / kk.norm(dim=-1, keepdim=True)",
              "padded rows", ("chunk_rwkv7", "fused_recurrent_rwkv7"),
              "RWKV-7 layer's removal key normalised with an eps (F.normalize): a zero key, e.g. a zero-padded "
              "token, gives 0, not 0 / 0 = NaN in a and b"),
)

def locate(guard: Safeguard, found: dict[str, markers.Marker] | None = None) -> Entry:
    """The entry of `guard`: the file, line and enclosing function its marker names (`found`: an index of the
    safeguard markers, `markers.index("safeguard")`, when several are located at once)."""
    found = markers.index("safeguard") if found is None else found
    if guard.id not in found:
        raise LookupError(f"safeguard {guard.id}: no line is marked `# safeguard: {guard.id}`")
    m = found[guard.id]
    return Entry(guard, m.path, m.line, markers.enclosing_function(markers.source(m), m.line))


def inventory() -> list[Entry]:
    found = markers.index("safeguard")
    return [locate(g, found) for g in REGISTRY]


def get(id: str) -> Safeguard | None:
    return next((g for g in REGISTRY if g.id == id), None)


def source(entry: Entry) -> str:
    """The text of the file that holds the entry's line."""
    return (ROOT / entry.path).read_text()


def shipped_line(entry: Entry) -> str:
    """The shipped line, as it reads without its markers."""
    return markers.strip_line(source(entry).splitlines()[entry.line - 1]).strip()


def with_naive(entry: Entry, naive: str | None = None) -> str:
    """The text of the entry's file with the marked line's code replaced by `naive` (default: the registry's naive
    form)."""
    return markers.replace(source(entry), "safeguard", entry.guard.id, entry.guard.naive if naive is None else naive,
                           entry.path)


def mutations() -> list[Safeguard]:
    """The safeguards reverted by a mutation of their own id (not a bug switch, not an existing mutation)."""
    return [g for g in REGISTRY if g.bug is None and g.mutation is None]


def caught_by(g: Safeguard) -> str:
    tests = ", ".join(f"`{t.split('::')[-1].split('[')[0]}`" for t in g.catching_tests())
    return f"bug switch `{g.bug}`; {tests}" if g.bug else tests


AXES = {"decays": "decay", "q_scales": "q scale", "lengths": "T", "dtypes": "dtype"}  # their names, in this order


def describe_range(atlas_range: dict) -> str:
    """Keyword arguments of `atlas.settings` as text: `{"q_scales": (100.0,)}` as "q scale 100", axes in AXES'
    order however the dict is ordered."""
    axes = sorted(atlas_range, key=lambda a: list(AXES).index(a) if a in AXES else len(AXES))
    return ", ".join(f"{AXES.get(a, a)} {' and '.join(map(_value, atlas_range[a]))}" for a in axes)


def _value(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def range_text(g: Safeguard) -> str:
    """Where the safeguard matters, in the atlas's terms ("decay 0.001, T 4096, dtype bf16, GPU"); "-": outside
    them."""
    if g.atlas is None:
        return "-"
    return describe_range(g.atlas) + (", GPU" if g.gpu_only else "")


def table(lines: bool = True) -> str:
    """The inventory as a Markdown table; `lines=False` (the guide's section) leaves the line numbers out."""
    rows = ["| safeguard | where | protects against | ops | naive form | where it matters (atlas) | caught by |",
            "|---|---|---|---|---|---|---|"]
    for e in inventory():
        g = e.guard
        where = e.path.removeprefix("fla_lab/") + (f":{e.line}" if lines else "")
        naive = g.naive.replace("|", "\\|")
        rows.append(f"| `{g.id}` | `{where}` `{e.function}` | {g.protects}: {g.what} | {', '.join(g.ops)} | "
                    f"`{naive}` | {range_text(g)} | {caught_by(g)} |")
    return "\n".join(rows)


GUIDE = ROOT / "docs" / "onboarding.md"
BEGIN, END = "<!-- safeguards:begin -->", "<!-- safeguards:end -->"


def render_guide(text: str) -> str:
    """`text` with the section between the safeguard markers replaced by the current table."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table(lines=False)}\n{END}{tail}"


def main(write: bool = False) -> int:
    """Print the table; `write`: refresh the guide's section."""
    if write:
        GUIDE.write_text(render_guide(GUIDE.read_text()))
    print(table())
    return 0


if __name__ == "__main__":
    main()
