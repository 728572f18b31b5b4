"""/memory follows the daemon's live resident size (what mihomo reports as ``inuse``), so a
dashboard's memory chart moves with the process: it rises when memory is taken and falls when
it is given back, frame by frame, on the daemon's clock."""

from __future__ import annotations

import json
import mmap
import os

import aiohttp
from helpers.apidaemon import LAN_INBOUND, api_base, api_block, bearer, quiet_global, running_daemon

from honk.core.clock import FakeClock

SECRET = "memory-secret"
TAKEN = 64 << 20  # bytes the test takes while a frame is due (written, so resident)
SEEN = 48 << 20  # bytes of that rise and fall a frame must show (the rest of the process moves too)
CONFIG = quiet_global() + LAN_INBOUND + "routing {\n    fallback: direct\n}\n" + api_block(SECRET)


def resident() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_memory_frames_follow_the_resident_size_as_it_rises_and_falls(tmp_path):
    clock = FakeClock()
    async with (
        running_daemon(tmp_path, CONFIG, clock) as daemon,
        aiohttp.ClientSession(headers=bearer(SECRET)) as http,
    ):
        async with http.get(api_base(daemon) + "/memory") as response:
            lines = response.content

            async def frame() -> dict[str, int]:
                return json.loads(await lines.readline())

            assert await frame() == {"inuse": 0, "oslimit": 0}  # mihomo's first frame
            clock.advance(1.0)
            before = (await frame())["inuse"]
            assert abs(before - resident()) < SEEN // 4

            # an anonymous mapping, written so it is resident, and unmapped: the process's size
            # rises and falls whatever the allocator's history (a malloc'd buffer may be kept)
            taken = mmap.mmap(-1, TAKEN)
            page_run = b"\x01" * (1 << 20)
            for _ in range(TAKEN // len(page_run)):
                taken.write(page_run)
            clock.advance(1.0)
            risen = (await frame())["inuse"]
            assert risen - before >= SEEN

            taken.close()
            clock.advance(1.0)
            fallen = (await frame())["inuse"]
            assert risen - fallen >= SEEN
