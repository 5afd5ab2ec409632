"""paged-tutorial: PagedAttention, run rather than read.

    import paged_tutorial as pt
    model = pt.load_model("smollm2-135m", dtype="float32")
    engine = pt.Engine(model, backend="auto", max_slots=2)
    print(engine.generate(["What is the capital of France?"])[0].text)
"""

from .config import CacheConfig, ModelConfig, llama_3_2_1b_config
from .engine import Engine, GenerationResult, StepReport
from .kv_cache import PagedKVCache
from .models import Model, load_model, random_model

__version__ = "0.1.0"

__all__ = ["CacheConfig", "Engine", "GenerationResult", "Model", "ModelConfig", "PagedKVCache",
           "StepReport", "llama_3_2_1b_config", "load_model", "random_model", "__version__"]
