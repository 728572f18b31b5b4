"""A headless Chromium driven over the Chrome DevTools Protocol (CDP), with aiohttp only.

One WebSocket to the browser target carries everything: pages are attached with
``flatten: true``, so page commands travel on the same socket tagged with their
``sessionId``. Only what the browser tests need is here: open a page, navigate,
evaluate a script (awaiting its promise), and record the page's events (the
Network domain, for preflights).

The browser runs in its own session (process group), with a throwaway profile;
:meth:`Browser.close` asks it to quit and kills the group if it does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp

from helpers.peers import require_binary

LAUNCH_TIMEOUT = 15.0  # seconds: a cold Chromium start takes 0.3 s here, a few seconds on a loaded runner
LAUNCH_POLL = 0.02  # seconds between looks for the port file (no event tells when Chromium writes it)
COMMAND_TIMEOUT = 10.0  # seconds: the longest one CDP command (an evaluate awaiting fetches) may take
QUIT_TIMEOUT = 5.0  # seconds a browser gets to exit after Browser.close before it is killed
PORT_FILE = "DevToolsActivePort"  # written into the profile by --remote-debugging-port=0
PROFILE_DIR = "chromium-profile"  # under the launch's workdir
PID_FILE = "chromium.pids"  # under the workdir: one browser pid (= its session id) per launch
LOG_TAIL = 2000  # characters of the browser's log quoted in a launch failure
WS_MAX_MESSAGE = 64 * 1024 * 1024  # bytes; CDP replies (protocol dumps, bodies) exceed aiohttp's 4 MiB

# Flags for a quiet, self-contained browser in a container: no sandbox (tests run as root), no
# first-run UI, no background network chatter, /tmp instead of a small /dev/shm.
BASE_FLAGS = (
    "--headless=new",
    "--remote-debugging-port=0",
    "--no-sandbox",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--metrics-recording-only",
    "--mute-audio",
    "--password-store=basic",
    "--use-mock-keychain",
)


class CdpError(Exception):
    """A CDP command failed, or a script threw in the page."""


class Browser:
    """A running Chromium and its browser-level CDP connection."""

    def __init__(self, proc: subprocess.Popen[bytes], profile: Path, log_path: Path) -> None:
        self.proc = proc
        self.profile = profile
        self.log_path = log_path
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._listeners: dict[str | None, list[Callable[[str, dict[str, Any]], None]]] = {}
        self._reader: asyncio.Task[None] | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def launch(cls, workdir: Path, *flags: str) -> AsyncIterator[Browser]:
        """Start Chromium with ``BASE_FLAGS`` plus ``flags``; profile and log under ``workdir``."""
        binary = require_binary("chromium")
        profile = workdir / PROFILE_DIR
        profile.mkdir(parents=True, exist_ok=True)
        (profile / PORT_FILE).unlink(missing_ok=True)  # a previous browser's port is not this one's
        log_path = workdir / "chromium.log"
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                [binary, *BASE_FLAGS, f"--user-data-dir={profile}", *flags, "about:blank"],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: renderers and zygotes die with it
            )
        with open(workdir / PID_FILE, "a") as pids:
            pids.write(f"{proc.pid}\n")
        browser = cls(proc, profile, log_path)
        try:
            await browser._connect()
            yield browser
        except BaseException:
            browser.kill()  # a failed test does not wait for a graceful quit
            raise
        finally:
            await browser.close()

    async def _connect(self) -> None:
        port_file = self.profile / PORT_FILE
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LAUNCH_TIMEOUT
        # Chromium writes "<port>\n<browser target path>" once its DevTools server listens.
        while not _complete_port_file(port_file):
            if self.proc.poll() is not None:
                raise CdpError(f"chromium exited with {self.proc.returncode}: {self.log_tail()}")
            if loop.time() > deadline:
                raise CdpError(f"chromium wrote no {PORT_FILE} in {LAUNCH_TIMEOUT}s: {self.log_tail()}")
            await asyncio.sleep(LAUNCH_POLL)
        port, path = port_file.read_text().split("\n")[:2]
        self._session = aiohttp.ClientSession()
        self._ws = await asyncio.wait_for(
            self._session.ws_connect(f"ws://127.0.0.1:{int(port)}{path}", max_msg_size=WS_MAX_MESSAGE),
            COMMAND_TIMEOUT,
        )
        self._reader = asyncio.ensure_future(self._read())

    async def close(self) -> None:
        """Ask the browser to quit and wait for it; kill its process group if it does not go."""
        try:
            if self._ws is not None and not self._ws.closed and self.proc.poll() is None:
                asked = True
                try:
                    await self.send("Browser.close", timeout=QUIT_TIMEOUT)
                except (CdpError, ConnectionError):
                    pass  # the connection closed under the command: it is quitting
                except TimeoutError:
                    asked = False
                if asked:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        await asyncio.get_running_loop().run_in_executor(None, self.proc.wait, QUIT_TIMEOUT)
        finally:
            self.kill()
            if self._reader is not None:
                self._reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._reader
            if self._ws is not None:
                await self._ws.close()
            if self._session is not None:
                await self._session.close()

    def kill(self) -> None:
        """SIGKILL the browser's whole process group (a no-op once it is gone) and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL:]
        except OSError:
            return "(no log)"

    # --- the protocol ------------------------------------------------------------------------

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for msg in self._ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                self._dispatch(json.loads(msg.data))
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(CdpError(f"DevTools connection closed: {self.log_tail()}"))

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message:
            future = self._pending.pop(message["id"], None)
            if future is not None and not future.done():
                if "error" in message:
                    future.set_exception(CdpError(json.dumps(message["error"])))
                else:
                    future.set_result(message.get("result", {}))
            return
        for listener in self._listeners.get(message.get("sessionId"), ()):
            listener(message["method"], message.get("params", {}))

    async def send(
        self, method: str, session: str | None = None, timeout: float = COMMAND_TIMEOUT, **params: Any
    ) -> dict[str, Any]:
        """One CDP command (on a page's session when ``session`` is given); its result."""
        assert self._ws is not None
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        try:
            await self._ws.send_str(json.dumps(message))
            return await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(ident, None)

    async def version(self) -> dict[str, Any]:
        return await self.send("Browser.getVersion")

    async def new_page(self) -> Page:
        """A fresh about:blank tab, attached on the browser socket, Page and Runtime enabled."""
        target = await self.send("Target.createTarget", url="about:blank")
        attached = await self.send("Target.attachToTarget", targetId=target["targetId"], flatten=True)
        page = Page(self, target["targetId"], attached["sessionId"])
        self._listeners.setdefault(page.session, []).append(page._on_event)
        await page.send("Page.enable")
        await page.send("Runtime.enable")
        return page


class Page:
    """One attached page target: commands on its session, its events recorded in order."""

    def __init__(self, browser: Browser, target_id: str, session: str) -> None:
        self.browser = browser
        self.target_id = target_id
        self.session = session
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._changed = asyncio.Event()

    def _on_event(self, method: str, params: dict[str, Any]) -> None:
        self.events.append((method, params))
        self._changed.set()

    async def send(self, method: str, timeout: float = COMMAND_TIMEOUT, **params: Any) -> dict[str, Any]:
        return await self.browser.send(method, session=self.session, timeout=timeout, **params)

    def mark(self) -> int:
        """A position in :attr:`events`; pass it as ``since`` to wait only for later events."""
        return len(self.events)

    async def wait_event(
        self,
        method: str,
        predicate: Callable[[dict[str, Any]], bool] = lambda p: True,
        since: int = 0,
        timeout: float = COMMAND_TIMEOUT,
    ) -> dict[str, Any]:
        """The first event ``method`` recorded from ``since`` on that satisfies ``predicate``."""

        async def scan() -> dict[str, Any]:
            seen = since
            while True:
                for name, params in self.events[seen:]:
                    if name == method and predicate(params):
                        return params
                seen = len(self.events)
                self._changed.clear()
                await self._changed.wait()

        return await asyncio.wait_for(scan(), timeout)

    async def navigate(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        since = self.mark()
        result = await self.send("Page.navigate", url=url)
        if result.get("errorText"):
            raise CdpError(f"navigation to {url} failed: {result['errorText']}")
        await self.wait_event("Page.loadEventFired", since=since)

    async def evaluate(self, expression: str, timeout: float = COMMAND_TIMEOUT) -> Any:
        """Run ``expression`` in the page, await it if it is a promise, return its JSON value."""
        result = await self.send(
            "Runtime.evaluate",
            timeout=timeout,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
            userGesture=True,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CdpError(f"script threw: {text}")
        return result["result"].get("value")


def _complete_port_file(path: Path) -> bool:
    try:
        lines = path.read_text().split("\n")
    except OSError:
        return False
    return len(lines) >= 2 and lines[0].isdigit() and lines[1].startswith("/devtools/browser/")


def leftovers(workdir: Path) -> list[int]:
    """Live processes of every browser launched in ``workdir``: members of their sessions (the
    zygotes, renderers and utility processes do not name the profile) and anything naming the
    profile. What ``pgrep -s SID`` and ``pgrep -f PROFILE`` would find, read from /proc so
    procps need not be installed."""
    try:
        sessions = {int(line) for line in (workdir / PID_FILE).read_text().split()}
    except OSError:
        sessions = set()
    needle = f"--user-data-dir={workdir / PROFILE_DIR}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session ...
        if fields[0] == "Z" and int(fields[1]) != os.getpid():
            continue  # a zombie another process will reap holds nothing
        if int(fields[3]) in sessions or needle in cmdline.split(b"\0"):
            found.append(int(entry.name))
    return found
