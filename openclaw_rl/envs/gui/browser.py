"""One headless Chromium, driven by Playwright from its own event-loop thread.

Why a thread of its own: Playwright's sync API is bound to the thread that started it and refuses
to run inside a running asyncio loop, and its calls cannot be abandoned half-way. Running the
*async* API on a private loop in a daemon thread lets the environment be called from any thread
(or from async code), and lets every call be bounded by ``asyncio.wait_for`` — a page whose
script spins forever cannot take the caller with it; the environment closes that page instead.

Why these flags: the machine runs as root (so ``--no-sandbox``), has no GPU, and refuses outside
connections; Chromium's background services (component updates, sync, safe browsing lists,
QUIC probes) would otherwise keep trying to reach the internet. Host resolution maps every name
except ``127.0.0.1`` to "not found", and every browser context additionally aborts any request
that is not for ``127.0.0.1`` / ``localhost`` — networking is limited to loopback twice over.
Each launch gets a fresh temporary profile (Playwright's default for ``launch``) and each episode
a fresh browser context (no cookies or storage carried between episodes).

Chromium is the Debian package at ``/usr/bin/chromium`` (``make sysdeps`` installs it); nothing is
ever downloaded (no ``playwright install``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import shutil
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit

from openclaw_rl.envs.base import EnvUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_CHROMIUM = "/usr/bin/chromium"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})

CHROMIUM_ARGS: tuple[str, ...] = (
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-breakpad",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--metrics-recording-only",
    "--disable-dev-shm-usage",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)


class BrowserError(RuntimeError):
    """The browser could not be started or stopped responding; the message says what to do."""


class ChromiumNotFound(BrowserError, EnvUnavailable):
    """No Chromium binary where we were told to look (retrying cannot help)."""


def check_chromium(executable_path: str) -> None:
    """Raise :class:`ChromiumNotFound`, saying where one is if there is, unless ``executable_path``
    is an executable file."""
    if os.path.isfile(executable_path) and os.access(executable_path, os.X_OK):
        return
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    raise ChromiumNotFound(
        f"Chromium not found at {executable_path!r}"
        + (
            f" (but {found} exists: pass chromium_path={found!r})"
            if found
            else "; install it with `make sysdeps` (Debian package `chromium`)"
        )
    )


def is_loopback_url(url: str) -> bool:
    """True for URLs the browser may load: loopback hosts, ``about:``, ``data:`` and ``blob:``."""
    parts = urlsplit(url)
    if parts.scheme in ("about", "data", "blob"):
        return True
    return parts.scheme in ("http", "https", "ws", "wss") and (parts.hostname or "") in LOOPBACK_HOSTS


async def _loopback_only(route: Any) -> None:
    """Playwright route handler: let loopback requests through, abort everything else."""
    if is_loopback_url(route.request.url):
        await route.continue_()
    else:
        await route.abort("blockedbyclient")


class BrowserHost:
    """A Chromium process plus the thread that drives it; shareable by many environments.

    ``run(coro, timeout)`` executes a coroutine on the browser thread and waits for it;
    ``new_context()`` (a coroutine) returns a fresh, loopback-only browser context, relaunching
    Chromium first if it crashed or was closed. ``close()`` stops everything; safe to call twice.
    """

    def __init__(
        self,
        executable_path: str = DEFAULT_CHROMIUM,
        extra_args: tuple[str, ...] = (),
        launch_timeout_s: float = 60.0,
        viewport: tuple[int, int] = (1024, 768),
    ) -> None:
        self.executable_path = executable_path
        self.extra_args = tuple(extra_args)
        self.launch_timeout_s = launch_timeout_s
        self.viewport = viewport
        self.launches = 0  # how many times Chromium was started (tests check relaunches)
        self._pw: Any = None
        self._browser: Any = None
        self._pid: int | None = None
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gui-browser", daemon=True)
        self._thread.start()
        self._launch_lock = asyncio.Lock()

    # -- running work on the browser thread ------------------------------------------------
    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the browser thread; raise ``TimeoutError`` after ``timeout`` seconds."""
        if self._closed:
            coro.close()
            raise BrowserError("the browser host was closed; create a new one")
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("BrowserHost.run called from the browser thread itself (would deadlock)")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"browser operation did not finish within {timeout:.1f}s") from None

    # -- lifecycle (coroutines: call them through run) -------------------------------------
    @property
    def connected(self) -> bool:
        """True while a launched Chromium is connected."""
        return self._browser is not None and self._browser.is_connected()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    @property
    def pid(self) -> int | None:
        """Process id of the Chromium browser process (for monitoring, and for crash tests)."""
        return self._pid

    async def ensure_browser(self) -> Any:
        """Return the connected browser, (re)launching Chromium when needed."""
        async with self._launch_lock:
            if self.connected:
                return self._browser
            if self._browser is not None:
                log.warning("chromium (pid %s) is gone; relaunching", self._pid)
                await self.drop_browser()
            check_chromium(self.executable_path)
            for attempt in (1, 2):
                try:
                    if self._pw is None:
                        from playwright.async_api import async_playwright

                        self._pw = await async_playwright().start()
                    self._browser = await self._pw.chromium.launch(
                        executable_path=self.executable_path,
                        headless=True,
                        args=[*CHROMIUM_ARGS, *self.extra_args],
                        timeout=self.launch_timeout_s * 1000,
                    )
                    break
                except Exception as exc:  # the Playwright driver itself may have died: restart once
                    if attempt == 2:
                        raise BrowserError(
                            f"could not launch Chromium at {self.executable_path}: "
                            f"{type(exc).__name__}: {exc}"
                        ) from exc
                    log.warning("chromium launch failed (%s); restarting Playwright and retrying", exc)
                    await self._stop_playwright()
            self.launches += 1
            self._pid = await self._browser_pid()
            log.info("chromium %s started (pid %s)", self._browser.version, self._pid)
            return self._browser

    async def processes(self) -> list[dict[str, Any]]:
        """Chromium's processes as ``{"type": "browser" | "renderer" | ..., "id": pid}`` (DevTools)."""
        if not self.connected:
            return []
        session = await self._browser.new_browser_cdp_session()
        try:
            info = await session.send("SystemInfo.getProcessInfo")
        finally:
            await session.detach()
        return [{"type": str(p.get("type")), "id": int(p["id"])} for p in info.get("processInfo", [])]

    async def _browser_pid(self) -> int | None:
        """Ask Chromium for its own process id over the DevTools protocol."""
        try:
            procs = await self.processes()
        except Exception as exc:  # only used for monitoring; a failure here is not fatal
            log.debug("could not read chromium pid: %s", exc)
            return None
        return next((p["id"] for p in procs if p["type"] == "browser"), None)

    async def new_context(self) -> Any:
        """A fresh loopback-only browser context (relaunching Chromium if it died)."""
        browser = await self.ensure_browser()
        ctx = await browser.new_context(
            viewport={"width": self.viewport[0], "height": self.viewport[1]},
            service_workers="block",
            accept_downloads=False,
        )
        await ctx.route("**/*", _loopback_only)
        return ctx

    async def drop_browser(self) -> None:
        """Close (or, if it does not answer, kill) Chromium; the next ``new_context`` relaunches it."""
        browser, self._browser, pid, self._pid = self._browser, None, self._pid, None
        if browser is not None:
            try:
                await asyncio.wait_for(browser.close(), 10)
            except Exception as exc:  # already dead or hung: make sure the process is gone
                log.debug("closing chromium failed (%s); killing pid %s", exc, pid)
                _kill(pid)

    async def _stop_playwright(self) -> None:
        pw, self._pw = self._pw, None
        if pw is not None:
            try:
                await asyncio.wait_for(pw.stop(), 10)
            except Exception as exc:  # the driver may already be gone
                log.debug("stopping playwright failed: %s", exc)

    async def _shutdown(self) -> None:
        await self.drop_browser()
        await self._stop_playwright()

    def close(self) -> None:
        """Close Chromium and Playwright and stop the thread; safe to call twice."""
        if self._closed:
            return
        try:
            self.run(self._shutdown(), timeout=20)
        except Exception as exc:  # never let cleanup raise into the caller; the pid is killed below
            log.warning("browser shutdown was not clean: %s", exc)
            _kill(self._pid)
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> BrowserHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kill(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone, which is what we wanted
    except PermissionError as exc:
        log.warning("cannot kill chromium pid %s: %s", pid, exc)


_shared: BrowserHost | None = None
_shared_lock = threading.Lock()


def shared_host() -> BrowserHost:
    """A process-wide :class:`BrowserHost`, for running many ``gui`` environments on one Chromium."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared.closed:
            _shared = BrowserHost()
        return _shared
