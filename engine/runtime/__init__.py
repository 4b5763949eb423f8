"""The runtime around the model: memory plan and cap, sized caches, chunked prefill, CUDA-graph decode,
prefix state cache, and the executor thread that interleaves requests. See docs/RUNTIME.md."""

from engine.runtime.builder import BuiltModel, build_model, prepare_for_inference
from engine.runtime.engine import LOAD_ERRORS, Engine, EngineBusy, PromptBatch, load_on_own_thread
from engine.runtime.loader import ModelSource, ModelSourceError, open_model_source
from engine.runtime.memory import MemoryPlan, MemoryPlanError, plan_memory
from engine.runtime.sampling import Sampler
from engine.runtime.scheduler import Failed, Finished, Handle, QueueFull, Request, Scheduler, Started, Token
from engine.runtime.torch_thread import TorchThread

__all__ = [
    "LOAD_ERRORS",
    "BuiltModel",
    "Engine",
    "EngineBusy",
    "Failed",
    "Finished",
    "Handle",
    "MemoryPlan",
    "MemoryPlanError",
    "ModelSource",
    "ModelSourceError",
    "PromptBatch",
    "QueueFull",
    "Request",
    "Sampler",
    "Scheduler",
    "Started",
    "Token",
    "TorchThread",
    "build_model",
    "load_on_own_thread",
    "open_model_source",
    "plan_memory",
    "prepare_for_inference",
]
