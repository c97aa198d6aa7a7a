"""The prompts of a load point: ``random``, ``sharegpt:FILE`` or ``prefix:LEN[,GROUPS]``.

A client of an arbitrary OpenAI-compatible server has no tokenizer of its model, so prompts
are text whose length is counted in common English words, each about one token to the usual
BPE tokenizers; the lengths stored are the server's own ``usage`` counts where it gives them
(:class:`tpubench.serving.metrics.RequestRecord`), the nominal ones otherwise.

* ``random``: ``input_len`` words drawn with the seed, ``output_len`` tokens asked for (as
  vLLM's ``random`` dataset, at a range ratio of 0).
* ``sharegpt:FILE``: the first human turn of each conversation of a ShareGPT JSON file
  (``[{"conversations": [{"from": "human", "value": ...}, ...]}, ...]``), shuffled with the
  seed, ``output_len`` tokens asked for.
* ``prefix:LEN[,GROUPS]``: ``input_len`` words of which the first ``LEN`` are shared by every
  prompt of a group (``GROUPS`` groups, 1 by default), the rest drawn per prompt: a prefix
  cache's best case, as vLLM's ``prefix_repetition``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

#: short words that BPE tokenizers (GPT-2's, Llama's) keep whole after a space
_WORD_TEXT = (
    "the of and to in is that it for on was with as be at by this had not are but from or have an they "
    "which one you were her all she there would their we him been has when who will more no if out so "
    "said what up its about into than them can only other new some could time these two may then do "
    "first any my now such like our over man me even most made after also did many before must through "
    "back years where much your way well down should because each just those people how too little "
    "state good very make world still own see men work long get here between both life being under "
    "never day same another know while last might us great old year off come since against go came "
    "right used take three"
)
WORDS = tuple(_WORD_TEXT.split())

KINDS = ("random", "sharegpt:FILE", "prefix:LEN[,GROUPS]")


@dataclass(frozen=True)
class Prompt:
    text: str
    input_len: int  # nominal: words, or the server's count once it answers
    output_len: int  # max_tokens asked for


class DatasetError(ValueError):
    """A dataset that cannot give prompts: a malformed name, a file that is not a dataset."""


def _words(rng: random.Random, count: int) -> list[str]:
    return rng.choices(WORDS, k=count)


def parse(name: str) -> tuple[str, str | None]:
    """``(kind, argument)`` of a dataset name; DatasetError naming the valid ones otherwise."""
    kind, _, argument = name.partition(":")
    if kind == "random" and not argument:
        return kind, None
    if kind in ("sharegpt", "prefix") and argument:
        return kind, argument
    raise DatasetError(f"unknown dataset; valid: {', '.join(KINDS)}")


def sharegpt_prompts(path: Path) -> list[str]:
    """The first human turn of each conversation of a ShareGPT file; DatasetError when the
    file cannot be read or holds no such conversation."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DatasetError(f"not a ShareGPT JSON file ({error})") from error
    prompts = []
    for entry in entries if isinstance(entries, list) else []:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if isinstance(turns, list) and turns and isinstance(turns[0], dict):
            text = turns[0].get("value")
            if turns[0].get("from") == "human" and isinstance(text, str) and text.strip():
                prompts.append(text)
    if not prompts:
        raise DatasetError(
            "no conversation starting with a human turn "
            '(expected [{"conversations": [{"from": "human", "value": ...}, ...]}, ...])'
        )
    return prompts


def prompts(name: str, count: int, input_len: int, output_len: int, seed: int = 0) -> list[Prompt]:
    """``count`` prompts of dataset ``name`` (see the module's docstring); the same seed gives
    the same prompts. DatasetError on a dataset that cannot give them."""
    kind, argument = parse(name)
    rng = random.Random(seed)
    if kind == "random":
        return [Prompt(" ".join(_words(rng, input_len)), input_len, output_len) for _ in range(count)]
    if kind == "sharegpt":
        texts = sharegpt_prompts(Path(argument or ""))
        rng.shuffle(texts)
        chosen = [texts[i % len(texts)] for i in range(count)]
        return [Prompt(text, len(text.split()), output_len) for text in chosen]
    length, _, groups_text = (argument or "").partition(",")
    groups_text = groups_text or "1"
    if not (length.isdigit() and groups_text.isdigit() and int(groups_text) > 0):
        raise DatasetError("expected prefix:LEN[,GROUPS], LEN and GROUPS whole numbers")
    prefix_len, groups = int(length), int(groups_text)
    if prefix_len >= input_len:
        raise DatasetError(f"the shared prefix ({prefix_len}) must be shorter than --input-len ({input_len})")
    prefixes = [_words(rng, prefix_len) for _ in range(groups)]
    return [
        Prompt(" ".join(prefixes[i % groups] + _words(rng, input_len - prefix_len)), input_len, output_len)
        for i in range(count)
    ]
