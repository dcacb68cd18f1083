"""Take a lock, work under its fencing token, release it: fencelock's sync API.

    python sync_lock.py fencelock://127.0.0.1:7070
"""

import sys

import fencelock


def main(url: str) -> None:
    client = fencelock.connect(url)
    with client.lock("examples/orders", ttl=10.0, wait=5.0) as guard:
        print(f"holding {guard.name} under token {guard.token}")
        # ... write to the resource, passing guard.token along ...
        if guard.lost.is_set():
            raise SystemExit("the lease was lost: stop writing")
    print("released")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fencelock://127.0.0.1:7070")
