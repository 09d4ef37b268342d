#!/usr/bin/env python3
"""Deploy the release: takes the deploy lock, then ships. The lock is held by a job that
never ends, so this fails every time — printing the time and a fresh attempt id each run."""

import datetime
import os
import pathlib
import sys

LOCK = pathlib.Path("deploy.lock")


def main() -> int:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")
    attempt = os.urandom(4).hex()
    print(f"[{now}] deploy attempt {attempt}: waiting for the deploy lock")
    if LOCK.exists():
        print(f"[{now}] error: deploy lock held by {LOCK.read_text().strip()}; giving up")
        return 1
    pathlib.Path("DEPLOYED").write_text("release 4.2\n")
    print(f"[{now}] deployed release 4.2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
