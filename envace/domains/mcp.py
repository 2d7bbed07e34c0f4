"""An MCP server as a domain's real backend (started from a command, spoken to over stdio).

One server process per domain and process, started on first use and stopped at exit. Its
tools are listed from the server and must include every tool of tools.json (the schemas the
model sees stay tools.json's: they are what DVC pins). A fresh state per episode comes from
the server's `reset` tool, called with the episode's scenario; the agent is never offered it.
Episodes of a batch interleave their calls, so before a call of another episode the server
is reset to that episode's scenario and its earlier calls are replayed: the server must be
deterministic (the same scenario and calls give the same state), as a sandbox is.
"""

from __future__ import annotations

import asyncio
import atexit
import copy
import json
import sys
import threading
from pathlib import Path
from typing import Any

from envace.domains.base import Backend, Response, Tool, error_response

TIMEOUT_S = 60


class McpError(RuntimeError):
    """The MCP server could not be started or broke the protocol; the message names the command."""


class McpServer:
    """A running MCP server and a client session to it, driven from synchronous code."""

    def __init__(self, command: list[str], cwd: Path):
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        self.label = " ".join(command)
        exe = sys.executable if command[0] in ("python", "python3") else command[0]  # the project's venv
        params = StdioServerParameters(command=exe, args=command[1:], cwd=str(cwd))
        self.loop = asyncio.new_event_loop()
        self.ready, self.stop = threading.Event(), None
        self.session, self.failure = None, None

        async def serve():
            self.stop = asyncio.Event()
            try:
                async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                    await session.initialize()
                    self.session = session
                    self.ready.set()
                    await self.stop.wait()
            except Exception as err:  # noqa: BLE001 — reported to the caller below, with the command
                self.failure = err
            finally:
                self.ready.set()

        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(serve(),), daemon=True)
        self.thread.start()
        if not self.ready.wait(TIMEOUT_S) or self.session is None:
            raise McpError(f"MCP server `{self.label}` (in {cwd}) did not start: {self.failure or 'timed out'}")
        self.current: Any = None  # the episode whose state the server holds
        atexit.register(self.close)

    def _run(self, coro):
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT_S)
        except Exception as err:  # noqa: BLE001
            raise McpError(f"MCP server `{self.label}`: {type(err).__name__}: {err}") from err

    def list_tools(self) -> list:
        return self._run(self.session.list_tools()).tools

    def call(self, name: str, arguments: dict) -> Response:
        return as_response(self._run(self.session.call_tool(name, arguments)))

    def close(self) -> None:
        if self.stop is not None and self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stop.set)
            self.thread.join(10)


def as_response(result) -> Any:
    """An MCP tool result as the JSON response the model reads: its structured content, else
    its text (parsed when it is JSON); a tool error as an error response."""
    text = "".join(getattr(c, "text", "") for c in result.content)
    if result.isError:
        return error_response("tool_error", text)
    if result.structuredContent is not None:
        return result.structuredContent
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class McpEpisodes:
    """The backend factory of an MCP domain: `factory(scenario)` is one episode's backend."""

    def __init__(self, folder: Path, command: list[str], reset: str, state: str | None, tools: tuple[Tool, ...]):
        self.folder, self.command, self.reset, self.state = folder, command, reset, state
        self.tools = tools
        self.server: McpServer | None = None

    def connect(self) -> McpServer:
        if self.server is None:
            server = McpServer(self.command, self.folder)
            served = {t.name for t in server.list_tools()}
            wanted = {t.name for t in self.tools} | {self.reset, *([self.state] if self.state else [])}
            missing = sorted(wanted - served)
            if missing:
                server.close()
                raise McpError(f"MCP server `{server.label}` does not serve {', '.join(missing)} "
                               f"(it serves {', '.join(sorted(served))}; see {self.folder / 'backend.json'} and tools.json)")
            self.server = server
        return self.server

    def __call__(self, scenario: Any) -> "McpBackend":
        return McpBackend(scenario, self)


class McpBackend(Backend):
    """One episode on the shared server: its scenario and the calls it has made."""

    def __init__(self, scenario: Any, episodes: McpEpisodes):
        super().__init__(scenario if scenario is not None else {})
        self.episodes, self.tools, self.made = episodes, episodes.tools, []

    def __deepcopy__(self, memo) -> "McpBackend":
        """A twin on the same server, at the same point (its calls are replayed when it runs)."""
        twin = McpBackend(copy.deepcopy(self.scenario, memo), self.episodes)
        twin.made = copy.deepcopy(self.made, memo)
        return twin

    def _activate(self) -> McpServer:
        server = self.episodes.connect()
        if server.current is not self:
            server.call(self.episodes.reset, {"scenario": self.scenario})
            for call in self.made:
                server.call(call["name"], call["arguments"])
            server.current = self
        return server

    def dispatch(self, name: str, args: dict) -> Response:
        response = self._activate().call(name, args)
        self.made.append({"name": name, "arguments": args})
        return response

    def state(self) -> Any:
        """The server's state tool's answer (None without one: success is then the checklist's alone)."""
        return self._activate().call(self.episodes.state, {}) if self.episodes.state else None
