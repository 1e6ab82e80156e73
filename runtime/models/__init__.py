"""Model adapters: the interface every provider implements, and the providers we ship."""

from ._adapter import Chunk as Chunk
from ._adapter import Finish as Finish
from ._adapter import FinishReason as FinishReason
from ._adapter import ModelAdapter as ModelAdapter
from ._adapter import ModelRequest as ModelRequest
from ._adapter import ReasoningDelta as ReasoningDelta
from ._adapter import RetryNotice as RetryNotice
from ._adapter import TextDelta as TextDelta
from ._adapter import ToolCallChunk as ToolCallChunk
from ._adapter import ToolSpec as ToolSpec
from ._adapter import Usage as Usage
from ._http import ApiKey as ApiKey
from ._http import Price as Price
from ._http import RetryPolicy as RetryPolicy
from ._openai import DEEPSEEK_BASE_URL as DEEPSEEK_BASE_URL
from ._openai import DEEPSEEK_MODELS as DEEPSEEK_MODELS
from ._openai import OpenAICompatibleAdapter as OpenAICompatibleAdapter
from ._openai import deepseek_adapter as deepseek_adapter
from ._ping import PING_MODEL as PING_MODEL
from ._ping import PingAdapter as PingAdapter
from ._registry import AdapterRegistry as AdapterRegistry
from ._registry import DuplicateAdapterError as DuplicateAdapterError
from ._registry import default_adapters as default_adapters
from ._scripted import Reply as Reply
from ._scripted import ScriptedAdapter as ScriptedAdapter
from ._scripted import ToolCall as ToolCall
