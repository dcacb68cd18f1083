"""The same with asyncio: the wait never blocks the event loop, and
cancelling the task withdraws the request.

    python aio_lock.py fencelock://127.0.0.1:7070
"""

import asyncio
import sys

import fencelock.aio


async def main(url: str) -> None:
    client = await fencelock.aio.connect(url)
    async with client.lock("examples/orders", ttl=10.0, wait=5.0) as guard:
        print(f"holding {guard.name} under token {guard.token}")
        await asyncio.sleep(0.1)  # ... the work ...
    print("released")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "fencelock://127.0.0.1:7070"))
