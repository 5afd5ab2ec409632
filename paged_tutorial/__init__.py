"""paged-tutorial: PagedAttention, run rather than read.

    import paged_tutorial as pt
    model = pt.load_model("smollm2-135m", dtype="float32")
    engine = pt.Engine(model, backend="auto", max_slots=2)
    print(engine.generate(["What is the capital of France?"])[0].text)
"""

from .config import CacheConfig, ModelConfig, llama_3_2_1b_config
from .engine import Engine, GenerationResult, StepReport, TokenStream
from .kv_cache import BlockEvent, PagedKVCache
from .models import Model, load_model, random_model
from .observe import OpCall, RecordingBackend
from .sampling_params import SamplingParams

__version__ = "0.1.0"

__all__ = ["BlockEvent", "CacheConfig", "Engine", "GenerationResult", "Model", "ModelConfig",
           "OpCall", "PagedKVCache", "RecordingBackend", "SamplingParams", "StepReport",
           "TokenStream", "llama_3_2_1b_config", "load_model", "random_model", "__version__"]
