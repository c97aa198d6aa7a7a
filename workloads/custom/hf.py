"""The Hugging Face route: ``--model hf:<model_type>``, ``hf:/path/to/folder`` (holding
``config.json``) or ``hf:<hub id>`` already in the local cache, with ``--model-config``
overrides and an optimum-benchmark task.

Models are built from their config class with random weights (``AutoModelFor*.from_config``,
seeded like every workload); nothing is downloaded (``HF_HUB_OFFLINE=1``,
``local_files_only``) and remote code never runs. A decoder that supports a static cache
(``_can_compile_fullgraph``) gets prefill and decode through its own ``StaticCache``, as
``generate(cache_implementation="static")`` uses it: the prompt pass keeps only the last
position's logits.
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"  # read when huggingface_hub is first imported, below

import torch
from torch import nn

from workloads.base import Batch, Shape
from workloads.custom.loading import one_line, parse_overrides, same_value
from workloads.custom.ref import ModelRef, ModelRefError
from workloads.custom.workload import CustomModel, GenerationSteps, dtype_of

#: optimum-benchmark's task names tpubench serves, and the Auto class (and its mapping) of each
TASKS = {
    "text-generation": ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "fill-mask": ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    "text2text-generation": ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    "image-classification": ("AutoModelForImageClassification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    "feature-extraction": ("AutoModel", "MODEL_MAPPING_NAMES"),
}
#: optimum-benchmark's synonyms (task_utils.SYNONYM_TASKS) of the tasks above
SYNONYMS = {
    "causal-lm": "text-generation",
    "masked-lm": "fill-mask",
    "seq2seq-lm": "text2text-generation",
    "translation": "text2text-generation",
    "summarization": "text2text-generation",
    "default": "feature-extraction",
    "sentence-similarity": "feature-extraction",
    "mask-generation": "feature-extraction",
}
#: the names tpubench's own help uses for three of them
SHORT_NAMES = {"text-generation": "causal-lm", "fill-mask": "masked-lm", "text2text-generation": "seq2seq-lm"}
#: ``--model-config`` keys that choose an implementation rather than set a config field
BUILD_OPTIONS = ("attn_implementation", "experts_implementation")
#: fields that count or size something (``num_hidden_layers``, ``n_embd``, ``intermediate_size``)
COUNT_FIELD = re.compile(r"^(?:num|n)_|_(?:size|layers|heads|dim)$|^d_(?:model|ff|kv)$")
MASKED_SHARE = 0.15
TEXT_SHAPES = {"cpu": (2, 128), "cuda": (8, 1024), "tpu": (8, 1024)}
IMAGE_BATCHES = {"cpu": 2, "cuda": 32, "tpu": 32}


def task_list(tasks: list[str]) -> str:
    return ", ".join(f"{t} ({SHORT_NAMES[t]})" if t in SHORT_NAMES else t for t in tasks)


def canonical_task(task: str) -> str:
    name = SYNONYMS.get(task, task)
    if name not in TASKS:
        raise ModelRefError(f"unknown task {task!r}; valid: {task_list(list(TASKS))}")
    return name


def load_config(target: str, overrides: dict[str, Any]) -> tuple[Any, Any]:
    """The config ``target`` names, built with the overrides (a config derives fields such as
    ``head_dim`` in its constructor, so they are passed there, never set afterwards): a local
    folder, a hub id already in the local cache, or a ``model_type``; and the config as it
    is without them (the defaults the overrides are told apart from)."""
    from transformers import PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    options = {k: v for k, v in overrides.items() if k not in BUILD_OPTIONS}
    folder = Path(target).expanduser()
    if target.startswith(("/", ".", "~")) or folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ModelRefError(f"folder {target!r} holds no config.json; give a folder with one, or hf:<model_type>")
        saved = read_config_dict(str(folder.resolve()), target)
    elif "/" in target:
        try:
            saved, _ = PretrainedConfig.get_config_dict(target, local_files_only=True)
        except (OSError, ValueError) as error:
            raise ModelRefError(
                f"hub id {target!r} is not in the local Hugging Face cache, and tpubench never downloads; "
                "use hf:<model_type> with --model-config key=value,..., or hf:/path/to/folder holding config.json"
            ) from error
    else:
        saved = {"model_type": target}
    model_type = saved.get("model_type")
    if model_type not in CONFIG_MAPPING:
        known = list(CONFIG_MAPPING.keys())
        close = difflib.get_close_matches(str(model_type), known, n=3)
        raise ModelRefError(
            f"unknown model_type {model_type!r}"
            + (f" (did you mean {', '.join(close)}?)" if close else "")
            + f"; {len(known)} are known, e.g. llama, gpt2, bert, t5, vit, mixtral; list them with "
            "python -c 'from transformers import CONFIG_MAPPING; print(*CONFIG_MAPPING)'"
        )
    config_class = CONFIG_MAPPING[model_type]
    fields = {k: v for k, v in saved.items() if k != "model_type"}
    base = config_class(**fields)
    check_keys(base, options, target)
    check_counts(base, options, target)
    try:
        return config_class(**{**fields, **options}), base
    except Exception as error:  # transformers' own checks of a field's type, or of fields together
        said = ",".join(f"{key}={value!r}" for key, value in options.items())
        raise ModelRefError(
            f"--model-config {said} is not a valid {config_class.__name__}: {one_line(error)}"
        ) from error


def read_config_dict(folder: str, target: str) -> dict[str, Any]:
    from transformers import PretrainedConfig

    try:
        return PretrainedConfig.get_config_dict(folder, local_files_only=True)[0]
    except (OSError, ValueError) as error:
        raise ModelRefError(f"config.json in {target!r} does not load: {one_line(error)}") from error


def check_keys(config: Any, options: dict[str, Any], target: str) -> None:
    """Every override must name a field of the config (HF would silently keep a misspelt one):
    one it has, an alias (``n_embd``), a property (``num_labels``) or a special token id
    (``decoder_start_token_id``, which configs take without declaring it)."""
    known = set(config.to_dict()) | set(getattr(config, "attribute_map", {}))
    known |= {name for name in dir(type(config)) if isinstance(getattr(type(config), name), property)}
    if unknown := [key for key in options if key not in known and not key.endswith("_token_id")]:
        hints = {key: difflib.get_close_matches(key, sorted(known), n=2) for key in unknown}
        said = "; ".join(f"{key} (did you mean {', '.join(h)}?)" if h else key for key, h in hints.items())
        raise ModelRefError(
            f"--model-config for {target} has keys its {type(config).__name__} does not: {said}; "
            f"it has {', '.join(sorted(k for k in known if not k.startswith('_')))}"
        )


def check_counts(config: Any, options: dict[str, Any], target: str) -> None:
    """A count or a size (a field named so, ``num_hidden_layers``, ``hidden_size``, ``n_head``,
    whose default is a positive integer) takes a positive integer: transformers builds
    ``range(-1)`` layers without a word, and a run of that model measures nothing."""
    for key, value in options.items():
        default = getattr(config, key, None)
        counts = isinstance(default, int) and not isinstance(default, bool) and default >= 1
        if counts and COUNT_FIELD.search(key) and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ModelRefError(
                f"--model-config {key}={value!r}: {key} of {target}'s {type(config).__name__} is a count; "
                f"valid: an integer >= 1 (its default is {default})"
            )


def servable_tasks(config: Any) -> list[str]:
    from transformers.models.auto import modeling_auto

    model_type = config.model_type
    return [task for task, (_, names) in TASKS.items() if model_type in getattr(modeling_auto, names)]


def choose_task(config: Any, asked: str | None, target: str) -> str:
    """The task asked for (it must be servable), else the one the config makes unambiguous:
    its ``architectures``, else the only one of the tasks its model_type serves (besides
    feature-extraction, which nearly all do). An encoder that also has a causal head (BERT:
    ``BertLMHeadModel`` needs ``is_decoder``) is a masked LM unless the config says it decodes."""
    from transformers.models.auto import modeling_auto

    servable = servable_tasks(config)
    if asked is not None:
        task = canonical_task(asked)
        if task not in servable:
            raise ModelRefError(
                f"hf:{target} ({config.model_type}) cannot serve {asked}; it can: {task_list(servable) or 'none'}"
            )
        return task
    for architecture in config.architectures or ():
        for task in servable:
            if getattr(modeling_auto, TASKS[task][1]).get(config.model_type) == architecture:
                return task
    heads = [t for t in servable if t != "feature-extraction"]
    if "fill-mask" in heads and "text-generation" in heads and not getattr(config, "is_decoder", False):
        heads.remove("text-generation")
    if len(heads) == 1:
        return heads[0]
    if not heads and servable:
        return "feature-extraction"
    raise ModelRefError(
        f"hf:{target} ({config.model_type}) can serve several tasks; pick one with --task: " + task_list(servable)
    )


def hf_model(ref: ModelRef) -> CustomModel:
    import transformers

    overrides = parse_overrides(ref.overrides)
    config, defaults = load_config(ref.target, overrides)
    task = choose_task(config, ref.task, ref.target)
    changed = tuple(
        (key, text)
        for key, text in ref.overrides
        if key in BUILD_OPTIONS or not same_value(getattr(defaults, key, None), overrides[key])
    )
    auto = getattr(transformers, TASKS[task][0])
    model_class = auto._model_mapping[type(config)]
    options = {k: v for k, v in overrides.items() if k in BUILD_OPTIONS}

    def build() -> nn.Module:
        return auto.from_config(config, dtype=torch.get_default_dtype(), **options)

    pixels = model_class.main_input_name == "pixel_values"
    feed = ImageInputs(config, task) if pixels else TextInputs(config, task)
    identity = json.dumps(
        {k: v for k, v in config.to_dict().items() if k not in ("transformers_version", "_name_or_path")},
        sort_keys=True,
        default=str,
    )
    static_cache = task == "text-generation" and getattr(model_class, "_can_compile_fullgraph", False)
    return CustomModel(
        ref=replace(ref, overrides=changed, task=SHORT_NAMES.get(task, task)),
        family=config.model_type,
        description=f"Hugging Face {model_class.__name__} ({task}) from its config, random weights",
        build=build,
        make_batch=feed.make_batch,
        loss=feed.loss,
        forward=feed.forward,
        dims=feed.dims,
        takes=f"{model_class.__name__}'s inputs take {', '.join(feed.dims)} only",
        default_shape=feed.default_shape(),
        identity=f"{identity}|{task}|{sorted(options.items())}",
        loss_source=lambda: "synthesised: mean of outputs" if task == "feature-extraction" else "model .loss",
        max_seq_len=context_length(config),
        generation=static_cache_steps(config, model_class) if static_cache else None,
    )


def context_length(config: Any) -> int:
    for name in ("max_position_embeddings", "n_positions", "max_seq_len"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    return 2**31


class TextInputs:
    """Random tokens, and the labels each task's head takes (its own loss computes from them)."""

    dims = ("seq_len",)

    def __init__(self, config: Any, task: str):
        self.config, self.task = config, task
        self.vocab_size = getattr(config, "vocab_size", None) or 2

    def default_shape(self) -> dict[str, Shape]:
        longest = context_length(self.config)
        return {kind: Shape(batch, seq_len=min(seq, longest)) for kind, (batch, seq) in TEXT_SHAPES.items()}

    def make_batch(self, shape: Shape, generator: torch.Generator) -> Batch:
        size = (shape.batch_size, shape.seq_len)
        tokens = torch.randint(0, self.vocab_size, size, generator=generator)
        if self.task == "text-generation":  # the model shifts the labels itself
            return {"input_ids": tokens, "labels": tokens}
        if self.task == "fill-mask":  # a fixed count of masked positions per sequence: static shapes
            count = max(1, round(MASKED_SHARE * shape.seq_len))
            positions = torch.rand(size, generator=generator).argsort(dim=1)[:, :count]
            labels = torch.full(size, -100).scatter(1, positions, tokens.gather(1, positions))
            mask_id = getattr(self.config, "mask_token_id", None) or 0
            return {"input_ids": tokens.scatter(1, positions, mask_id), "labels": labels}
        if self.task == "text2text-generation":  # the decoder's inputs are the labels shifted right
            return {"input_ids": tokens, "labels": torch.randint(0, self.vocab_size, size, generator=generator)}
        return {"input_ids": tokens}

    def arguments(self, batch: Batch) -> dict[str, torch.Tensor]:
        if self.task == "feature-extraction" and getattr(self.config, "is_encoder_decoder", False):
            return {"input_ids": batch["input_ids"], "decoder_input_ids": batch["input_ids"]}
        return batch

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        out = model(**self.arguments(batch))
        return out.last_hidden_state.float().mean() if self.task == "feature-extraction" else out.loss

    def forward(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        if self.task == "text2text-generation":
            return model(**batch).logits
        out = model(**self.arguments({"input_ids": batch["input_ids"]}))
        return out.last_hidden_state if self.task == "feature-extraction" else out.logits


class ImageInputs:
    """Random pixels at the config's image size, and class labels for a classifier."""

    dims = ("image_size",)

    def __init__(self, config: Any, task: str):
        self.config, self.task = config, task
        size = getattr(config, "image_size", 224)
        self.image_size = size if isinstance(size, int) else size[0]
        self.channels = getattr(config, "num_channels", 3)

    def default_shape(self) -> dict[str, Shape]:
        return {kind: Shape(batch, image_size=self.image_size) for kind, batch in IMAGE_BATCHES.items()}

    def make_batch(self, shape: Shape, generator: torch.Generator) -> Batch:
        pixels = torch.randn(shape.batch_size, self.channels, shape.image_size, shape.image_size, generator=generator)
        if self.task != "image-classification":
            return {"pixel_values": pixels}
        labels = torch.randint(0, self.config.num_labels, (shape.batch_size,), generator=generator)
        return {"pixel_values": pixels, "labels": labels}

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        out = model(**{**batch, "pixel_values": batch["pixel_values"].to(dtype_of(model))})
        return out.last_hidden_state.float().mean() if self.task == "feature-extraction" else out.loss

    def forward(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        out = model(pixel_values=batch["pixel_values"].to(dtype_of(model)))
        return out.last_hidden_state if self.task == "feature-extraction" else out.logits


def static_cache_steps(config: Any, model_class: type) -> GenerationSteps:
    """Greedy prefill and decode through transformers' ``StaticCache``: fixed shapes at every
    position (the cache is masked, not sliced), so a compiled backend builds each graph once.

    The cache writes at its own device-side length counter; a prefill starts a generation, so
    it first rewinds the cache with ``reset()``, as ``generate`` does when it reuses one.
    Positions are passed explicitly (``position_ids``). One host read remains on torch_xla:
    from the second prefill on, transformers tests the initialised cache's offset tensor
    (``q_offset == 0`` in ``masking_utils._ignore_causal_mask_sdpa``), which XLA reports as one
    ``aten::_local_scalar_dense`` fallback per prefill (no recompile); the row shows it.
    """
    from transformers import StaticCache

    parameters = inspect.signature(model_class.forward).parameters
    cache_name = "cache" if "cache" in parameters else "past_key_values"  # renamed in transformers 5.x
    keeps_last = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}

    def allocate_cache(batch_size: int, length: int, device: torch.device, dtype: torch.dtype) -> Any:
        # the layers take their batch, device and dtype from the first keys written into them
        return StaticCache(config=config, max_cache_len=length)

    def prefill(model: nn.Module, batch: Batch, cache: Any) -> torch.Tensor:
        cache.reset()
        prompt = batch["input_ids"]
        positions = torch.arange(prompt.shape[1], device=prompt.device).unsqueeze(0)
        out = model(input_ids=prompt, position_ids=positions, use_cache=True, **{cache_name: cache}, **keeps_last)
        return out.logits[:, -1:].argmax(dim=-1)

    def decode(model: nn.Module, token: torch.Tensor, position: torch.Tensor, cache: Any) -> torch.Tensor:
        out = model(input_ids=token, position_ids=position.view(1, 1), use_cache=True, **{cache_name: cache})
        position.add_(1)
        return out.logits[:, -1:].argmax(dim=-1)

    def cache_tensors(cache: Any) -> list[torch.Tensor]:
        return [t for layer in cache.layers for t in (layer.keys, layer.values) if isinstance(t, torch.Tensor)]

    return GenerationSteps(allocate_cache, prefill, decode, cache_tensors)
