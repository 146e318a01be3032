"""The tokenizer: byte-level BPE built from GGUF metadata with the `tokenizers` library.

GGUF stores the vocabulary, the merges, token types, special ids and the chat template;
the pre-tokenizer is named by `tokenizer.ggml.pre` and mirrors the model's original
`tokenizer.json`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from athanor.errors import ModelLoadError

# Regexes of the pre-tokenizers named by `tokenizer.ggml.pre`.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|eom_id|>")
CONTROL_TOKEN = 3  # GGUF token type of special tokens such as <|im_start|>


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("smollm", "starcoder", "refact"):
        # SmolLM2's tokenizer.json: single digits, then GPT-2 byte-level splitting.
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    if pre in ("llama-bpe", "llama3", "dbrx", "smaug-bpe"):
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), "isolated"), byte_level])
    if pre in ("qwen2", "deepseek-r1-qwen"):
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_QWEN2_SPLIT), "isolated"), byte_level])
    return pre_tokenizers.ByteLevel(add_prefix_space=False)


@dataclass
class Tokenizer:
    """Text <-> token ids, special ids and the chat template of one model."""

    backend: HFTokenizer
    bos_id: int | None
    eos_id: int | None
    chat_template: str | None = None
    stop_ids: tuple[int, ...] = ()
    """Ids that end a generation: eos plus end-of-turn tokens such as <|im_end|> and <|eot_id|>."""
    add_bos: bool = False
    _template: object = field(default=None, repr=False)

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids: list[int] = self.backend.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def save_hf(self, directory: Path) -> None:
        """Write tokenizer.json and tokenizer_config.json as HF expects them."""
        self.backend.save(str(directory / "tokenizer.json"))
        token = self.backend.id_to_token
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": token(self.bos_id) if self.bos_id is not None else None,
            "eos_token": token(self.eos_id) if self.eos_id is not None else None,
            "add_bos_token": self.add_bos,
            "chat_template": self.chat_template,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special))

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render a conversation with the model's own template (a sandboxed Jinja environment, as HF does)."""
        if not self.chat_template:
            raise ModelLoadError("this model has no chat template: drop --chat and pass a plain prompt")
        if self._template is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_template_error
            self._template = env.from_string(self.chat_template)
        special = self.backend.id_to_token
        return str(
            self._template.render(  # type: ignore[attr-defined]
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=special(self.bos_id) if self.bos_id is not None else "",
                eos_token=special(self.eos_id) if self.eos_id is not None else "",
            )
        )


def _raise_template_error(message: str) -> None:
    raise TemplateError(message)


def tokenizer_from_gguf_fields(fields: dict[str, object], where: str) -> Tokenizer:
    """Build a `Tokenizer` from GGUF metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`)."""
    kind = fields.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelLoadError(f"{where}: tokenizer.ggml.model is {kind!r}; athanor reads byte-level BPE ('gpt2') tokenizers")
    tokens = fields.get("tokenizer.ggml.tokens")
    merges = fields.get("tokenizer.ggml.merges")
    if not isinstance(tokens, list) or not isinstance(merges, list):
        raise ModelLoadError(f"{where}: tokenizer.ggml.tokens or tokenizer.ggml.merges is missing")
    types = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    backend.pre_tokenizer = _pre_tokenizer(str(fields.get("tokenizer.ggml.pre", "default")))
    backend.decoder = decoders.ByteLevel()
    assert isinstance(types, list)
    special = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == CONTROL_TOKEN]
    backend.add_special_tokens(special)
    bos = fields.get("tokenizer.ggml.bos_token_id")
    eos = fields.get("tokenizer.ggml.eos_token_id")
    template = fields.get("tokenizer.chat_template")
    return _with_stops(
        backend,
        bos_id=int(bos) if isinstance(bos, int) else None,
        eos_id=int(eos) if isinstance(eos, int) else None,
        chat_template=str(template) if template else None,
        add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
    )


def _with_stops(
    backend: HFTokenizer, bos_id: int | None, eos_id: int | None, chat_template: str | None, add_bos: bool
) -> Tokenizer:
    stops = {eos_id} if eos_id is not None else set()
    for name in END_OF_TURN:
        if (i := backend.token_to_id(name)) is not None:
            stops.add(i)
    return Tokenizer(backend, bos_id, eos_id, chat_template, tuple(sorted(stops)), add_bos)


def tokenizer_from_hf_dir(directory: Path) -> Tokenizer | None:
    """The tokenizer of an HF model directory (tokenizer.json + tokenizer_config.json), or None if it has none."""
    file = directory / "tokenizer.json"
    if not file.is_file():
        return None
    try:
        backend = HFTokenizer.from_file(str(file))
    except Exception as e:  # the Rust side raises a bare Exception on malformed JSON
        raise ModelLoadError(f"{file}: not a valid tokenizer.json ({e})") from None
    config_file = directory / "tokenizer_config.json"
    try:
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{config_file}: not valid JSON ({e.msg} at line {e.lineno})") from None

    def special_id(key: str) -> int | None:
        value = config.get(key)
        if isinstance(value, dict):  # older configs store AddedToken dicts
            value = value.get("content")
        return backend.token_to_id(value) if isinstance(value, str) else None

    return _with_stops(backend, special_id("bos_token"), special_id("eos_token"),
                       config.get("chat_template"), bool(config.get("add_bos_token", False)))
