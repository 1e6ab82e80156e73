"""MCP servers mounted as an agent's scoped tools (needs ``loopdock[mcp]``)."""

from ._client import McpServer as McpServer
from ._client import require_sdk as require_sdk
from ._spec import McpServerSpec as McpServerSpec
from ._spec import parse_servers as parse_servers
