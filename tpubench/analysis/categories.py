"""One category table for every trace source, so that shares compare across chips.

"matmul: 41% of the step on the GPU vs 63% on the TPU" needs an aten op, a CUDA kernel and
an HLO op that do the same work to land in the same bucket. :func:`categorize` decides
from the op's name (per source: aten ops, CUDA kernel names, XLA's HLO instruction
names), then from the tool's own category where the name says nothing (XProf names TPU
fusions ``fusion.12`` and calls them "convolution fusion", "loop fusion"...). The rules
are data, below, in the order they are tried; tests/test_ops.py holds real names to them.
"""

from __future__ import annotations

import re

CATEGORIES = (
    "matmul",
    "convolution",
    "attention",
    "normalization",
    "elementwise",
    "reduction",
    "collective",
    "data movement",
    "host/runtime",
    "other",
)

SOURCES = ("hlo", "aten", "kernel")


def _rules(*pairs: tuple[str, str], flags: int = re.IGNORECASE) -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((category, re.compile(pattern, flags)) for category, pattern in pairs)


#: aten ops and the other host-side events of a torch.profiler trace, first match wins.
#: Wrappers go first: an autograd node named after attention is bookkeeping, not attention.
ATEN_RULES = _rules(
    (
        "host/runtime",
        r"^(autograd::|torch::autograd::|Optimizer\.|Torch-Compiled Region|TorchDynamo|CompiledFunction"
        r"|Pregraph bytecode|AOTDispatcher|cuda[A-Z]|cu[A-Z]|detach$|aten::(item|_local_scalar_dense)$)"
        r"|Backward\d*$",
    ),
    # an Inductor graph's call: with its kernels named (a profiled cpu-compile run's are, see
    # tpubench.backends.dynamo.name_kernels) its own time is the wrapper's; in older traces it
    # held the fused kernels too, which nothing can split (tpubench ops says so)
    ("other", r"^## Call CompiledFxGraph"),
    # FSDP2's copies of a unit's shards into (and out of) the all-gather's flat buffer, and its
    # annotations of them (``FSDP::all_gather_copy_out (blocks.0)``): local copies on the
    # rank's device, not communication, though their names say all_gather
    ("data movement", r"^(fsdp|FSDP)::all_gather_copy_(in|out)\b"),
    # FSDP2's other annotations (``FSDP::all_gather (blocks.0)``, ``FSDP::post_backward_reduce``)
    # wrap a unit's step, as Inductor's call does a graph's: their self time is FSDP's own,
    # and the communication inside is the c10d/gloo/nccl ops they enclose, counted there (the
    # all-gather wrapper counted as collective put a gloo FSDP run's collective share at 40.7%
    # against the 21.7% of its collectives' union, collective_ms)
    ("other", r"^FSDP::"),
    ("collective", r"^c10d::|nccl|record_param_comms|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"),
    # Inductor names a C++ template's kernel ``kernel`` (``graph_0_kernel`` with its profile
    # events on): tpubench compiles without max-autotune, whose GEMM templates would be named so
    # too, so the one template in its CPU graphs is flex attention's
    ("attention", r"attention|^aten::_?fused_sdp|flex_attention|^graph_\d+_kernel$"),
    ("normalization", r"norm(_backward)?$|_norm_|batch_norm|group_norm|layer_norm|rms_norm"),
    ("convolution", r"conv(olution)?(_backward)?|conv[123]d|mkldnn_convolution"),
    ("matmul", r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|mv|addmv|dot|vdot|einsum|_scaled_mm|_int_mm)$"),
    (
        "reduction",
        r"^aten::_?(sum|mean|amax|amin|max|min|argmax|argmin|prod|var|std|var_mean|std_mean|norm|linalg_vector_norm"
        r"|logsumexp|cumsum|cumprod|softmax|log_softmax|_softmax|_log_softmax|softmax_backward_data"
        r"|_softmax_backward_data|_log_softmax_backward_data|nll_loss\w*|cross_entropy_loss|topk|sort|any|all)$",
    ),
    (
        "data movement",
        r"^aten::_?(copy_|to|_to_copy|contiguous|clone|cat|stack|view|_unsafe_view|reshape|transpose|permute|t|expand"
        r"|expand_as|slice|select|index|index_select|index_put_|gather|scatter\w*|split\w*|chunk|narrow|as_strided"
        r"|unsqueeze|squeeze|flatten|unflatten|embedding|embedding_dense_backward|empty|empty_strided|empty_like"
        r"|zeros|zeros_like|ones|ones_like|full|full_like|new_\w+|fill_|zero_|alias|lift_fresh|resolve_conj"
        r"|resolve_neg|pad|constant_pad_nd|repeat|roll|flip|unbind|split_with_sizes|masked_select|set_)$",
    ),
    (
        "elementwise",
        r"^aten::_?(add|sub|rsub|mul|div|addcmul|addcdiv|lerp|sqrt|rsqrt|exp|log|pow|neg|abs|sign|reciprocal|clamp"
        r"|clamp_min|clamp_max|where|masked_fill|dropout|native_dropout|gelu|silu|relu|tanh|sigmoid|softplus|erf"
        r"|sin|cos|maximum|minimum|eq|ne|lt|le|gt|ge|logical_\w+|bitwise_\w+|threshold|hardtanh|mish|elu"
        r"|triu|tril|bernoulli|uniform|normal|rand\w*|arange|_foreach_\w+|fused_adamw?|\w+_backward)_?$",
    ),
    flags=0,  # case matters: ``NativeLayerNormBackward0`` is an autograd node, ``native_layer_norm_backward`` an op
)

#: CUDA kernel names (Kineto ``kernel``/``gpu_memcpy``/``gpu_memset`` events)
KERNEL_RULES = _rules(
    ("collective", r"nccl|all_?reduce|all_?gather|reduce_?scatter"),
    ("attention", r"flash|fmha|attention|attn"),
    ("normalization", r"layer_?norm|rms_?norm|batch_?norm|group_?norm|_norm_"),
    ("convolution", r"conv|fprop|dgrad|wgrad|winograd|implicit_?gemm"),
    ("matmul", r"gemm|cublas|cutlass|nvjet|xmma|matmul|splitk|triton_tem_fused_(add)?b?mm|_mm_|gemv"),
    ("reduction", r"reduce|softmax|triton_(red|per)_|cross_?entropy|nll_loss|argmax|cub::|sort"),
    ("data movement", r"^mem(cpy|set)|copy|CatArray|index|gather|scatter|transpose|embedding|cat_|fill|pad"),
    ("elementwise", r"elementwise|triton_poi_|multi_tensor_apply|foreach|gelu|silu|relu|tanh|sigmoid|dropout"),
)

#: HLO opcodes (XLA names an instruction ``<opcode>.<n>``, a fusion after the ops it fuses)
HLO_COLLECTIVES = frozenset(
    {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all", "collective-permute"}
)
HLO_HOST = frozenset({"infeed", "outfeed", "send", "recv", "send-done", "recv-done", "host-compute"})
HLO_DATA_MOVEMENT = frozenset(
    {
        "copy",
        "copy-start",
        "copy-done",
        "bitcast",
        "broadcast",
        "transpose",
        "concatenate",
        "slice",
        "dynamic-slice",
        "dynamic-update-slice",
        "gather",
        "scatter",
        "reshape",
        "pad",
        "iota",
        "tuple",
        "get-tuple-element",
        "parameter",
        "constant",
        "wrapped",
        "reverse",
    }
)
HLO_ELEMENTWISE = frozenset(
    {
        "add",
        "subtract",
        "multiply",
        "divide",
        "maximum",
        "minimum",
        "power",
        "remainder",
        "exponential",
        "exponential-minus-one",
        "log",
        "log-plus-one",
        "sqrt",
        "rsqrt",
        "cbrt",
        "tanh",
        "logistic",
        "negate",
        "abs",
        "sign",
        "floor",
        "ceil",
        "round-nearest-even",
        "cosine",
        "sine",
        "erf",
        "compare",
        "select",
        "clamp",
        "convert",
        "and",
        "or",
        "xor",
        "not",
        "shift-left",
        "shift-right-logical",
        "rng",
        "rng-bit-generator",
        "is-finite",
        "atan2",
        "real",
        "imag",
    }
)
_HLO_SUFFIX = re.compile(r"(\.\d+|\.clone|\.remat\d*)+$")

#: XProf's HLO categories (hlo_stats "category") where the op's name says nothing
XPROF_CATEGORIES = _rules(
    # TPUs lower matmuls to convolutions and XProf calls both "convolution": the framework
    # op decides (see categorize); without one, a transformer's are matmuls
    ("matmul", r"convolution|output fusion|dot|gemm"),
    ("collective", r"all-reduce|all-gather|reduce-scatter|all-to-all|collective|send|recv|megascale"),
    ("reduction", r"input fusion|reduce"),
    ("data movement", r"data formatting|copy|dynamic-update-slice|dynamic-slice|gather|scatter"),
    ("elementwise", r"elementwise|loop fusion"),
    ("host/runtime", r"infeed|outfeed|host"),
)


#: Inductor's generated kernels, named after the aten ops they fuse (``descriptive_names``:
#: ``graph_0_cpp_fused_gelu_view_2`` on a CPU, ``triton_per_fused_native_layer_norm_0`` on a GPU)
INDUCTOR_KERNEL = re.compile(r"^(graph_\d+_)?(cpp|triton)_([a-z]+_)?fused_(?P<ops>\w*?)(_\d+)?$")
#: what decides a fused kernel's category, in order: the heaviest kind of work among its ops
#: (a layer norm fused with the residual add is a normalization kernel, a softmax with its
#: scaling a reduction); anything else it fuses is elementwise or data movement work
FUSED_RULES = _rules(
    ("attention", r"attention|_scaled_dot_product|sdpa|flash"),
    ("normalization", r"layer_norm|rms_norm|batch_norm|group_norm|native_norm"),
    ("matmul", r"(^|_)(b?mm|addmm|baddbmm|linear)(_|$)"),
    ("convolution", r"(^|_)convolution(_|$)"),
    ("reduction", r"softmax|(^|_)(sum|mean|amax|amin|max|min|argmax|argmin|logsumexp|var_mean|nll_loss|cumsum)(_|$)"),
    (
        "elementwise",
        r"(^|_)(add|sub|mul|div|pow|exp|log|sqrt|rsqrt|tanh|gelu|silu|relu|sigmoid|neg|where|clamp|erf|addcmul"
        r"|addcdiv|lerp|lt|gt|eq|ne|le|ge|sin|cos|reciprocal|abs|maximum|minimum|masked_fill|scalar_tensor)(_|$)",
    ),
    ("data movement", r"."),  # only views, copies, embeddings, clones, cats: moving data
)


def fused_category(name: str) -> str | None:
    """The category of one of Inductor's fused kernels (see :data:`INDUCTOR_KERNEL`), from the
    ops its name lists; None for any other name."""
    found = INDUCTOR_KERNEL.match(name)
    if found is None:
        return None
    return _first(FUSED_RULES, found["ops"]) or "elementwise"


def _first(rules: tuple[tuple[str, re.Pattern[str]], ...], name: str) -> str | None:
    return next((category for category, pattern in rules if pattern.search(name)), None)


def hlo_category(op: str) -> str | None:
    """The category an HLO instruction's name implies (``dot.710``, ``subtract_exponential_fusion.clone``)."""
    base = _HLO_SUFFIX.sub("", op.lstrip("%"))
    if base in HLO_COLLECTIVES or base.removesuffix("-start").removesuffix("-done") in HLO_COLLECTIVES:
        return "collective"
    if base in HLO_HOST:
        return "host/runtime"
    words = [word for word in base.replace("-", "_").split("_") if word and word != "fusion"]
    hyphenated = base.removesuffix("_fusion").split("_")
    if re.search(r"attention|fmha|flash", base):
        return "attention"
    if base.startswith("convolution"):
        return "convolution"
    if "dot" in words or re.search(r"gemm|cublas|matmul", base):
        return "matmul"
    if "reduce" in words or base.startswith(("reduce", "argmax", "sort")) or "softmax" in words:
        return "reduction"
    if re.search(r"norm", base):
        return "normalization"
    if hyphenated and all(word in HLO_DATA_MOVEMENT for word in hyphenated):
        return "data movement"
    if hyphenated and all(word in HLO_ELEMENTWISE or word in HLO_DATA_MOVEMENT for word in hyphenated):
        return "elementwise"
    return None


def categorize(source: str, op: str, hint: str | None = None, framework_op: str | None = None) -> str:
    """The shared category (one of :data:`CATEGORIES`) of ``op`` from trace ``source``.

    ``hint`` is the tool's own category (XProf's for an HLO op) and ``framework_op`` the
    framework op behind an HLO op; both only decide when the name does not.
    """
    if source in ("aten", "kernel") and (fused := fused_category(op)) is not None:
        return fused
    if source == "aten":
        return _first(ATEN_RULES, op) or "other"
    if source == "kernel":
        return _first(KERNEL_RULES, op) or "other"
    if source != "hlo":
        raise ValueError(f"unknown trace source {source!r}; valid: {', '.join(SOURCES)}")
    found = hlo_category(op)
    # torch_xla names the aten op behind an HLO op (``aten__addmm``). It decides what the
    # name cannot: a generic ``fusion.12``, and a ``convolution`` that is a TPU's matmul.
    behind = None
    if framework_op:
        behind = _first(ATEN_RULES, "aten::" + re.sub(r"^aten__", "", framework_op.rsplit("/", 1)[-1]))
    if found == "convolution" and behind == "matmul":
        return "matmul"
    if found is not None:
        return found
    if behind in ("matmul", "convolution", "attention", "normalization", "collective"):
        return behind
    return (_first(XPROF_CATEGORIES, hint) if hint else None) or "other"
