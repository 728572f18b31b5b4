"""systemd's readiness protocol (``sd_notify``), spoken without libsystemd.

Under a ``Type=notify`` unit systemd passes the path of a datagram socket in
``NOTIFY_SOCKET``; the service sends newline-separated ``KEY=value`` lines to
it. honk says:

* ``READY=1`` once the first configuration is committed and every listener is
  bound (``systemctl start`` returns then, and a unit ordered after honk starts
  only when honk really serves), and again when a reload has finished;
* ``RELOADING=1`` with ``MONOTONIC_USEC`` when a reload starts (``systemctl
  reload`` and ``honk reload`` alike), so ``systemctl status`` shows it;
* ``STOPPING=1`` when a stop is requested, before the drain;
* ``STATUS=`` a one-line summary with each of them.

Without ``NOTIFY_SOCKET`` (not under systemd, or another unit type) every call
does nothing. A path starting with ``@`` is an abstract socket. A send that
fails is logged once at debug level and never stops the daemon.
"""

from __future__ import annotations

import logging
import os
import socket
import time

__all__ = ["Notifier"]

log = logging.getLogger("honk.daemon.notify")


class Notifier:
    """The daemon's line to systemd (see the module docstring)."""

    def __init__(self, address: str | None = None) -> None:
        address = os.environ.get("NOTIFY_SOCKET") if address is None else address
        self.address = ("\0" + address[1:]) if address and address.startswith("@") else (address or None)
        self._failed = False

    def ready(self, status: str = "") -> bool:
        return self._send({"READY": "1", "STATUS": status})

    def reloading(self, status: str = "reloading the configuration") -> bool:
        # systemd pairs RELOADING=1 with the monotonic time it was sent at (sd_notify(3))
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self._send({"RELOADING": "1", "MONOTONIC_USEC": str(usec), "STATUS": status})

    def stopping(self, status: str = "stopping: draining live flows") -> bool:
        return self._send({"STOPPING": "1", "STATUS": status})

    def _send(self, fields: dict[str, str]) -> bool:
        if self.address is None:
            return False
        message = "\n".join(f"{key}={value}" for key, value in fields.items() if value).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message, self.address)
        except OSError as exc:
            if not self._failed:
                self._failed = True
                log.debug("systemd notification failed address=%s error=%s", self.address, exc)
            return False
        return True
