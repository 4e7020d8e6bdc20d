#!/usr/bin/env bash
# Fault suite: kill a rank, the bootstrap root (rank 0) or the launcher at a random
# point of a job, N times, and check what is left.
#
#   bash scripts/fault-suite.sh              # 30 trials (FAULT_TRIALS), 4 ranks
#   FAULT_TRIALS=100 FAULT_SEED=7 bash scripts/fault-suite.sh
#
# Needs root (a third of the trials run on emulated hosts, `halo launch --hosts 2`,
# which makes its own network namespaces; nothing else is touched). Each trial starts
# `halo launch -n 4 [--hosts 2] -- halo check --loop 600` (3-10 s of all-to-all and
# all-to-all-v) with every rank started through `sh -c 'trap "" TERM; exec ...'`: the
# rank ignores SIGTERM, so a survivor must notice the failure itself — the launcher's
# SIGTERM does not end it, only its own error does, or SIGKILL after --grace 30 s,
# which counts as a hang.
# Then, after a random delay, SIGKILL goes to
#   - rank:     a random rank other than 0 (after bootstrap or during it),
#   - root:     rank 0, which serves the rendezvous (early: often during bootstrap),
#   - launcher: `halo launch` itself (its ranks get a parent-death SIGKILL).
# A trial passes when
#   - everything ended within FAULT_BOUND seconds (default 60),
#   - every surviving rank failed by itself, printing `error: ...` (not success, not
#     SIGKILL after the grace period); for a launcher kill, no rank process remains,
#   - no /dev/shm file of the trial's processes is left (for a launcher kill, after the
#     next `halo launch`, which removes what a dead launcher could not),
#   - no network namespace of the trial's launcher is left.
# A kill that came after the job had finished (every rank exited 0) passes when
# nothing is left, and is counted apart. Prints `N passed, M failed`.
set -euo pipefail
cd "$(dirname "$0")/.."
trials="${FAULT_TRIALS:-30}"
bound="${FAULT_BOUND:-60}"
ranks=4
RANDOM="${FAULT_SEED:-$$}"
if [ "$(id -u)" -ne 0 ]; then
  echo "fault-suite.sh: needs root (emulated hosts, and ranks of any user)" >&2
  exit 1
fi
export CARGO_INCREMENTAL=0
echo "== building halo (release)"
cargo build --release -q -p halo-cli --bin halo
halo="$PWD/target/release/halo"
# Every blocking wait of the ranks gives up after 10 s.
export HALO_TIMEOUT_MS=10000
export HALO_BOOTSTRAP_TIMEOUT_MS=15000
export HALO_DEBUG=error

began=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
late=0
declare -A by_kind_pass=() by_kind_fail=()

# The pids of the processes a launcher started (the wrappers) and of the ranks under them.
rank_pid() { # launcher rank -> pid of the halo process of that rank, or nothing
  local w
  for w in $(pgrep -P "$1" 2>/dev/null); do
    if tr '\0' '\n' <"/proc/$w/environ" 2>/dev/null | grep -qx "RANK=$2"; then
      # The wrapper (sh) or, under --hosts, `ip netns exec`/`sh`: the halo process is
      # the deepest descendant.
      local p="$w" c
      while c=$(pgrep -P "$p" 2>/dev/null | head -1) && [ -n "$c" ]; do p="$c"; done
      echo "$p"
      return
    fi
  done
}

descendants() { # pid -> all descendants
  local c
  for c in $(pgrep -P "$1" 2>/dev/null); do
    echo "$c"
    descendants "$c"
  done
}

for t in $(seq 1 "$trials"); do
  dir="$work/t$t"
  mkdir -p "$dir"
  case $((RANDOM % 3)) in
    0) kind=rank ;;
    1) kind=root ;;
    *) kind=launcher ;;
  esac
  hosts=()
  if [ $((RANDOM % 3)) -eq 0 ]; then hosts=(--hosts 2); fi
  # Delay in ms: the root early (bootstrap is the first ~0.5 s), the others anywhere.
  if [ "$kind" = root ]; then delay=$((RANDOM % 1500)); else delay=$((RANDOM % 4000)); fi
  job=("$halo" check --loop 600 --counts 0,7,1024)
  if [ "$kind" = launcher ]; then
    # The ranks themselves, so that the launcher's parent-death signal reaches them
    # (it is not inherited across a wrapper's fork).
    "$halo" launch -n "$ranks" "${hosts[@]}" --grace 30 --timeout $((bound - 5)) -- \
      "${job[@]}" >"$dir/out" 2>&1 &
  else
    # SIGTERM ignored (the disposition survives exec; the rank is still the
    # launcher's own child, whose shared memory it removes when it is killed).
    "$halo" launch -n "$ranks" "${hosts[@]}" --grace 30 --timeout $((bound - 5)) -- \
      sh -c 'trap "" TERM; exec "$@"' sh "${job[@]}" >"$dir/out" 2>&1 &
  fi
  launcher=$!
  sleep "$(awk "BEGIN { print $delay / 1000 }")"
  seen=$(descendants "$launcher" | tr '\n' ' ')
  victim=""
  killed_rank=""
  case $kind in
    rank) killed_rank=$((1 + RANDOM % (ranks - 1))) ;;
    root) killed_rank=0 ;;
    launcher) victim=$launcher ;;
  esac
  if [ -n "$killed_rank" ]; then
    # The rank may not be started yet (emulated hosts take a moment): wait for it.
    for _ in $(seq 1 100); do
      victim=$(rank_pid "$launcher" "$killed_rank")
      [ -n "$victim" ] && break
      kill -0 "$launcher" 2>/dev/null || break
      sleep 0.05
    done
  fi
  [ -n "$victim" ] && kill -KILL "$victim" 2>/dev/null || true
  # Everything must end within the bound.
  ended=1
  for _ in $(seq 1 $((bound * 10))); do
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$launcher" 2>/dev/null; then ended=0; kill -KILL "$launcher" 2>/dev/null || true; fi
  wait "$launcher" 2>/dev/null || true
  # Ranks of a SIGKILLed launcher end by their parent-death signal (milliseconds).
  sleep 0.5
  left_procs=""
  for p in $seen; do
    # Alive and not a zombie waiting for init to reap it.
    state=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || true)
    if [ -n "$state" ] && [ "$state" != Z ]; then left_procs="$left_procs $p"; fi
  done
  if [ -n "$left_procs" ]; then
    kill -KILL $left_procs 2>/dev/null || true
  fi
  if [ "$kind" = launcher ]; then
    # The next launch removes what a dead launcher could not.
    "$halo" launch -n 1 -- true >/dev/null 2>&1 || true
  fi
  reasons=()
  [ "$ended" -eq 1 ] || reasons+=("still running after ${bound}s")
  [ -z "$left_procs" ] || reasons+=("processes left:$left_procs")
  # How each rank ended, from its own output: a rank that noticed the failure says
  # `error: ...` (prefixed [RANK] by the launcher); one that passed says so.
  all_ok=0
  if [ -z "$left_procs" ] && ! grep -q 'error:' "$dir/out" && [ "$kind" != launcher ] &&
    [ "$(grep -c 'collectives verified' "$dir/out" || true)" -ge "$ranks" ]; then
    all_ok=1
  fi
  if [ "$kind" != launcher ] && [ "$all_ok" -eq 0 ]; then
    for r in $(seq 0 $((ranks - 1))); do
      [ "$r" = "$killed_rank" ] && continue
      grep -q "^\[$r\] error:" "$dir/out" ||
        reasons+=("rank $r did not fail by itself after rank $killed_rank was killed (exited 0, or was killed after the grace period)")
    done
  fi
  # Shared memory of this trial's processes, and the launcher's record.
  for p in $launcher $seen; do
    for f in /dev/shm/"$p":* /dev/shm/halo-bell-*-"$p"-* /dev/shm/halo-launch-"$p"-*; do
      [ -e "$f" ] && reasons+=("left $f")
    done
  done
  ns=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^halo-$launcher-" || true)
  [ -z "$ns" ] && true || reasons+=("namespaces left: $(echo "$ns" | tr '\n' ' ')")
  if [ "$all_ok" -eq 1 ]; then late=$((late + 1)); fi
  label="$kind${hosts[*]:+ (hosts)} after ${delay} ms"
  if [ ${#reasons[@]} -eq 0 ]; then
    passed=$((passed + 1))
    by_kind_pass[$kind]=$(( ${by_kind_pass[$kind]:-0} + 1 ))
    echo "trial $t: ok   $label$([ "$all_ok" -eq 1 ] && echo ' (the job had finished)')"
  else
    failed=$((failed + 1))
    by_kind_fail[$kind]=$(( ${by_kind_fail[$kind]:-0} + 1 ))
    echo "trial $t: FAIL $label: ${reasons[*]}"
    sed 's/^/      /' "$dir/out" | tail -n 8
  fi
done
echo "== fault suite: $trials trials (kills: rank ${by_kind_pass[rank]:-0}+${by_kind_fail[rank]:-0}, root ${by_kind_pass[root]:-0}+${by_kind_fail[root]:-0}, launcher ${by_kind_pass[launcher]:-0}+${by_kind_fail[launcher]:-0} passed+failed); $late ended before the kill; $(( $(date +%s) - began )) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
