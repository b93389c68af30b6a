#!/usr/bin/env bash
# Idempotent: make sure Debian's redis-server is installed, for the tests that
# share a Hypothesis example database over Redis (tests/tooling/test_redis_campaign.py).
# Never fatal: if it cannot be installed those tests skip with the reason.
set -uo pipefail
command -v redis-server >/dev/null 2>&1 && exit 0
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-redis: redis-server missing and cannot apt-get here; the Redis tests will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt_install() { apt-get install -y -qq --no-install-recommends redis-server >/dev/null 2>&1; }
# A fresh machine has no package lists yet: update only when the install fails.
if ! apt_install; then
  apt-get update -qq >/dev/null 2>&1 && apt_install
fi
if command -v redis-server >/dev/null 2>&1; then
  echo "ensure-redis: installed $(redis-server --version | cut -d' ' -f3)" >&2
else
  echo "ensure-redis: could not install redis-server; the Redis tests will skip" >&2
fi
exit 0
