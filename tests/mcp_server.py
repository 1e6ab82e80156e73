"""A real MCP server written with the SDK (FastMCP), for the MCP client's tests.

``python mcp_server.py stdio`` serves on stdin/stdout; ``python mcp_server.py http PORT``
serves streamable HTTP on 127.0.0.1:PORT at /mcp.
"""

import os
import sys

import anyio
from mcp.server.fastmcp import Context, FastMCP, Image

server = FastMCP("test", host="127.0.0.1", port=int(sys.argv[2]) if len(sys.argv) > 2 else 8000)


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo: {text}"


@server.tool()
def pid() -> str:
    """This server's process id."""
    return str(os.getpid())


@server.tool()
def crash() -> str:
    """Exit the server in the middle of the call."""
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never answer."""
    await anyio.sleep_forever()
    return ""


@server.tool()
def fail() -> str:
    """Fail as a tool error."""
    raise ValueError("boom")


@server.tool()
async def grow(ctx: Context) -> str:  # type: ignore[type-arg]
    """Add the tool `late` and say the list changed."""
    server.add_tool(lambda: "late one", name="late", description="Added later")
    await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool()
def picture() -> Image:
    """A 100-byte PNG-looking image."""
    return Image(data=b"\x89PNG" + b"0" * 96, format="png")


@server.tool()
def shout() -> str:
    """Write a megabyte to stderr, then answer."""
    sys.stderr.write("e" * 1024 * 1024 + "\n")
    sys.stderr.flush()
    return "still here"


@server.tool()
def flood() -> str:
    """Write a line of 9 MiB to stdout, the protocol's channel."""
    sys.stdout.buffer.write(b"x" * (9 * 1024 * 1024))
    sys.stdout.buffer.flush()
    return "never read"


if __name__ == "__main__":
    server.run("streamable-http" if sys.argv[1] == "http" else "stdio")
