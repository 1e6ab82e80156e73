"""Tools an agent can call: the registry, per-agent views and the built-ins."""

from ._builtins import ShellPolicy as ShellPolicy
from ._builtins import builtin_tools as builtin_tools
from ._builtins import list_dir as list_dir
from ._builtins import read_file as read_file
from ._builtins import shell_tool as shell_tool
from ._builtins import write_file as write_file
from ._registry import AgentTools as AgentTools
from ._registry import Disposer as Disposer
from ._registry import ToolRegistry as ToolRegistry
from ._tool import Tool as Tool
from ._tool import ToolContext as ToolContext
