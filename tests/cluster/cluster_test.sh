#!/usr/bin/env bash
# The testbed of scripts/cluster, end to end: 2 hosts at 100 Mbit. An MPI_Allreduce and a gcomp
# allreduce give the exact sums, MPI sees two hosts, the link that gcomp's network measurement
# sees (every rank sending at once, full duplex) is within 25% of the rate; the same job started
# as torchrun starts one (one agent per host, no mpiexec; with the Python module) runs gcomp on
# Gloo over each host's link, two hosts told apart, the sum exact, the link as measured within
# 25%; each host's link counters during a run (--link-bytes) hold the allreduces' bytes, what
# one host's link sent the other's received; compare_hooks.py on 2 hosts x 2 ranks counts each
# host's link per step, and top-k on two_level sends at most 0.6x the flat sparse allgather's; a run that is interrupted ends what it started, and
# nothing is left behind: no namespace, link, qdisc, process or state. Bad input is refused with
# status 2. Skips (77) where namespaces can't be made.
#   cluster_test.sh SOURCE_DIR PROBE [PYTHON PYTHONPATH]
set -uo pipefail
src=$1 probe=$2 python=${3:-} pythonpath=${4:-}
cluster=$src/scripts/cluster
bg=""  # the background run of the interrupt check, ended first on a failure
fail() {
  echo "FAIL: $*"
  if [ -n "$bg" ]; then kill -INT "$bg" 2>/dev/null; wait "$bg" 2>/dev/null; fi
  "$cluster" down >/dev/null 2>&1
  exit 1
}
skip() { echo "SKIPPED: $*"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "not root: network namespaces and tc need root"
command -v ip >/dev/null && command -v tc >/dev/null || skip "iproute2 (ip, tc) is not installed"
command -v mpiexec.mpich >/dev/null || skip "mpiexec.mpich is not installed"
probe_ns=gcomp-test-probe-$$
if ! err=$(ip netns add "$probe_ns" 2>&1); then skip "cannot make a network namespace: $err"; fi
ip netns del "$probe_ns"
[ -e /run/gcomp-cluster ] && skip "a testbed is up already (another run's): not touching it"

# What the machine's own namespace has now, to compare with at the end.
links_before=$(ip -o link show | awk -F': ' '{print $2}' | sort)
qdiscs_before=$(tc qdisc show | sort)
netns_before=$(ip netns list | sort)

left_behind() {
  local what=$1
  [ -z "$(ip netns list | grep -E '^gcomp-(sw|h[0-9]+)( |$)')" ] || fail "$what: namespaces left: $(ip netns list | tr '\n' ' ')"
  [ ! -e /run/gcomp-cluster ] || fail "$what: /run/gcomp-cluster left"
  [ "$(ip -o link show | awk -F': ' '{print $2}' | sort)" = "$links_before" ] || fail "$what: the machine's links changed"
  [ "$(tc qdisc show | sort)" = "$qdiscs_before" ] || fail "$what: the machine's qdiscs changed"
  [ "$(ip netns list | sort)" = "$netns_before" ] || fail "$what: the list of namespaces changed"
  ! pgrep -f "^$probe" >/dev/null || fail "$what: a probe process is left: $(pgrep -af "^$probe")"
  ! ls -d /sys/fs/cgroup/cpu/gcomp-h* /sys/fs/cgroup/gcomp-h* >/dev/null 2>&1 \
    || fail "$what: CPU cgroups left: $(ls -d /sys/fs/cgroup/cpu/gcomp-h* /sys/fs/cgroup/gcomp-h* 2>/dev/null)"
}

# Bad input: status 2 and one line naming the value; nothing made.
for bad in "up --hosts 0 --rate 1gbit" "up --hosts 2 --rate fast" "up --hosts 2" \
           "up --hosts 2 --rate 1gbit --ranks-per-host x" "up --hosts 2 --rate 1gbit --cpus x" \
           "up --hosts 2 --rate 1gbit --cpus 0.01" "run -- true" "frobnicate"; do
  # shellcheck disable=SC2086
  msg=$("$cluster" $bad 2>&1); rc=$?
  [ "$rc" = 2 ] || fail "'cluster $bad' exited $rc, not 2: $msg"
  echo "refused: cluster $bad: $msg"
done
left_behind "after bad input"

# One run that brings the testbed up and takes it down. Results are printed before
# MPI_Finalize, which can hang over UCX's TCP after large transfers: the timeout bounds it.
lb=$(mktemp)
out=$("$cluster" run --hosts 2 --rate 100mbit --timeout 120 --link-bytes "$lb" -- "$probe" 2097152 2>&1); rc=$?
echo "$out"
line=$(grep '^ranks=' <<<"$out" | tail -1)
[ -n "$line" ] || fail "the probe printed no result (exit status $rc)"
[ "$rc" = 0 ] || echo "note: the run exited $rc after printing its result"
get() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$line"; }
[ "$(get ranks)" = 2 ] || fail "ranks=$(get ranks), not 2"
[ "$(get hosts)" = 2 ] || fail "MPI sees $(get hosts) hosts, not 2"
[ "$(get exact)" = 1 ] || fail "an allreduce gave a wrong sum"
link=$(get link_mbit)
# TCP's goodput on a 100 Mbit link of 1500-byte frames is 94.9 Mbit/s (1448 of 1526 bytes on the
# wire); a shared link would give each of the two senders about half.
awk -v l="$link" 'BEGIN { exit !(l >= 75 && l <= 125) }' \
  || fail "gcomp measured the link at $link Mbit/s, not within 25% of 100"
echo "link as measured: $link Mbit/s (100 Mbit/s shaped)"
# The links' counters: each host sent at least its share of the three MPI_Allreduces of 2M floats
# (a float each at 2 ranks: 3 x 8 MiB), and what one host's link sent the other's received (the
# bridge forwards it; a few ARP frames aside).
read -r tx0 tx1 rx0 rx1 < <(/usr/bin/env python3 -c 'import json, sys
d = json.load(open(sys.argv[1])); print(*d["tx_bytes"], *d["rx_bytes"])' "$lb") \
  || fail "--link-bytes wrote no counters: $(cat "$lb")"
rm -f "$lb"
for tx in "$tx0" "$tx1"; do
  [ "$tx" -ge $((3 * 8 * 1048576)) ] || fail "a host's link sent $tx bytes, fewer than the allreduces' 25165824"
done
for pair in "$tx0 $rx1" "$tx1 $rx0"; do
  awk -v p="$pair" 'BEGIN { split(p, v, " "); d = v[1] - v[2]; if (d < 0) d = -d; exit !(d <= 8192) }' \
    || fail "one host sent and the other received: $pair bytes"
done
echo "link bytes: h0 tx $tx0 rx $rx0, h1 tx $tx1 rx $rx1"
left_behind "after run"

# The same, started torchrun's way: one agent per host, torch's variables, gcomp over Gloo.
if [ -n "$python" ] && PYTHONPATH=$pythonpath "$python" -c "import gcomp.torch" 2>/dev/null; then
  out=$(PYTHONPATH=$pythonpath "$cluster" run --hosts 2 --rate 100mbit --launcher torchrun \
        --timeout 120 -- "$python" "$src/tests/cluster/torch_probe.py" 2>&1); rc=$?
  echo "$out" | grep -v '^\[W\|^WARNING\|^\*\*\*\|Setting OMP'
  [ "$rc" = 0 ] || fail "the torchrun-style run exited $rc"
  lines=$(grep -o 'torch rank=.*' <<<"$out" | sort)
  [ "$(wc -l <<<"$lines")" = 2 ] || fail "the torchrun-style run printed $(wc -l <<<"$lines") results, not 2"
  for r in 0 1; do
    l=$(grep "rank=$r " <<<"$lines") || fail "no result from rank $r"
    g() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$l"; }
    [ "$(g transport)" = gloo ] || fail "rank $r ran gcomp on $(g transport), not gloo"
    [ "$(g size)" = 2 ] && [ "$(g hosts)" = 2 ] || fail "rank $r: size $(g size), hosts $(g hosts)"
    [ "$(g local_rank)" = 0 ] || fail "rank $r is local rank $(g local_rank) on its host, not 0"
    [ "$(g exact)" = 1 ] || fail "rank $r: the sum is not exact"
    awk -v l="$(g link_mbit)" 'BEGIN { exit !(l >= 75 && l <= 125) }' \
      || fail "rank $r: gcomp on Gloo measured the link at $(g link_mbit) Mbit/s"
  done
  echo "torchrun-style run: gcomp on Gloo, link as measured $(grep -o 'link_mbit=[0-9.]*' <<<"$lines" | head -1)"
  left_behind "after the torchrun-style run"

  # compare_hooks.py on 2 hosts x 2 ranks: each host's link counted per step. Top-k 1% on
  # two_level sends each host's sum once (its two owners' halves, n/100 elements in all), the
  # flat sparse allgather both ranks' selections (2 n/100) at least once: at most 0.5x, 0.6x with
  # the frames' headers and the barriers.
  hooks=$(mktemp -d)
  PYTHONPATH=$pythonpath timeout -k 10 300 "$python" "$src/python_examples/compare_hooks.py" \
    --cluster --ranks 4 --ranks-per-host 2 --network 1gbit --model mlp --epochs 1 \
    --max-steps 10 --eval-every 10 --rows gcomp_topk1_two_level,gcomp_topk1_pinned \
    --timeout 200 --port 29731 --out "$hooks" >"$hooks/log" 2>&1; rc=$?
  [ "$rc" = 0 ] || { cat "$hooks/log"; fail "compare_hooks.py on 2 hosts x 2 ranks exited $rc"; }
  "$python" - "$hooks"/compare_mlp_cluster2x2_1gbit <<'PY' || { cat "$hooks/log"; fail "compare_hooks.py's link bytes"; }
import json, sys
got = {}
for row, alg in (("gcomp_topk1_two_level", "two_level"), ("gcomp_topk1_pinned", "sparse_allgather")):
    r = json.load(open(f"{sys.argv[1]}.{row}.json"))
    assert r["ranks"] == 4 and r["config"]["ranks_per_host"] == 2, r
    assert list(r["algorithm"]) == [alg], r["algorithm"]
    link = r["link"]
    assert link["steps"] == 9 and len(link["tx_per_step"]) == 2, link
    assert all(tx > 0 for tx in link["tx_per_step"] + link["rx_per_step"]), link
    got[alg] = max(link["tx_per_step"])
ratio = got["two_level"] / got["sparse_allgather"]
print(f"each host's link per step: two_level {got['two_level']:.0f} B, sparse_allgather "
      f"{got['sparse_allgather']:.0f} B ({ratio:.2f}x)")
assert ratio <= 0.6, got
PY
  grep -q "each host's link: sent per step" "$hooks"/compare_mlp_cluster2x2_1gbit.md \
    || fail "the table has no link column"
  rm -rf "$hooks"
  left_behind "after compare_hooks.py on 2 hosts x 2 ranks"
else
  echo "note: no Python module with torch: the torchrun-style run is not tried"
fi

# up, two runs on it (the testbed stays), status, down twice (idempotent).
"$cluster" up --hosts 2 --rate 100mbit || fail "up failed"
st=$("$cluster" status); grep -q "up: 2 hosts" <<<"$st" || fail "status does not say up: $st"
b=$("$cluster" bytes); [ "$(grep -cE '^h[01] tx=[0-9]+ rx=[0-9]+$' <<<"$b")" = 2 ] || fail "bytes printed: $b"
msg=$("$cluster" up --hosts 2 --rate 100mbit 2>&1) && fail "a second up succeeded"
for i in 1 2; do
  r=$("$cluster" run --timeout 60 -- sh -c 'echo "$PMI_RANK $MASTER_ADDR $GLOO_SOCKET_IFNAME"' | sort)
  [ "$r" = "$(printf '0 10.213.0.1 eth0\n1 10.213.0.1 eth0')" ] || fail "run $i printed: $r"
  [ -e /run/gcomp-cluster ] || fail "run $i took down a testbed it did not bring up"
done
"$cluster" down || fail "down failed"
"$cluster" down || fail "a second down failed"
left_behind "after up, run, down"

# --cpus: each host's processes in a CPU cgroup of its own, capped: a rank that burns CPU takes
# at least 1/C times its CPU time in wall time (2x at 0.5 cores; 1.8x allows the quota's
# accounting at period ends). Where this machine has no cpu cgroup controller, up refuses.
# Each rank writes its line to a file of its own (the ranks' output can interleave on the way).
burn='import os, sys, time
w, c = time.perf_counter(), time.process_time()
while time.process_time() - c < 0.4:
    pass
cg = [l for l in open("/proc/self/cgroup").read().splitlines() if "gcomp-h" in l]
r = os.environ["PMI_RANK"]
with open(f"{sys.argv[1]}/rank{r}", "w") as f:
    print(r, (time.perf_counter() - w) / (time.process_time() - c), cg, file=f)'
if msg=$("$cluster" up --hosts 2 --rate 1gbit --cpus 0.5 2>&1); then
  grep -q "0.5 cores a host" <<<"$("$cluster" status)" || fail "status does not give the cores: $("$cluster" status)"
  burnt=$(mktemp -d)
  r=$("$cluster" run --timeout 60 -- /usr/bin/python3 -c "$burn" "$burnt" 2>&1) \
    || { rm -rf "$burnt"; fail "the --cpus run failed: $r"; }
  r=$(cat "$burnt"/rank* 2>/dev/null || true)
  rm -rf "$burnt"
  echo "--cpus 0.5: $r"
  for i in 0 1; do
    line=$(grep "^$i " <<<"$r") || fail "rank $i wrote nothing: $r"
    grep -q "gcomp-h$i" <<<"$line" || fail "rank $i is not in host $i's cgroup: $line"
    /usr/bin/python3 -c "import sys; sys.exit(float(sys.argv[1]) < 1.8)" "$(awk '{print $2}' <<<"$line")" \
      || fail "rank $i ran faster than 0.5 cores: $line"
  done
  "$cluster" down || fail "down after --cpus failed"
  left_behind "after --cpus"
else
  grep -q "cgroup" <<<"$msg" || fail "up --cpus failed: $msg"
  echo "note: --cpus not tried: $msg"
  left_behind "after a refused --cpus"
fi

# An interrupted run ends its processes and the testbed it brought up. The run is interrupted
# once both ranks say they are asleep (past MPI_Init): on a loaded machine that can take a while,
# so the wait is long, and it ends early when the run does.
bg_out=$(mktemp)
set -m  # job control: the background run gets its own process group and takes SIGINT
"$cluster" run --hosts 2 --rate 100mbit -- "$probe" --sleep 300 >"$bg_out" 2>&1 &
bg=$!
set +m
for i in $(seq 1200); do
  [ "$(grep -c '^asleep rank=' "$bg_out")" = 2 ] && break
  kill -0 "$bg" 2>/dev/null || break
  sleep 0.1
done
if [ "$(grep -c '^asleep rank=' "$bg_out")" != 2 ]; then
  cat "$bg_out"
  kill -0 "$bg" 2>/dev/null || { wait "$bg"; bg=""; rm -f "$bg_out"; fail "the run ended before its ranks were asleep"; }
  rm -f "$bg_out"; fail "the run's ranks were not asleep within 120 s"
fi
pid=$bg
sleep 1
kill -INT "$pid"
wait "$pid"; rc=$?
bg=""
cat "$bg_out"; rm -f "$bg_out"
[ "$rc" = 130 ] || fail "the interrupted run exited $rc, not 130"
left_behind "after an interrupt"
echo "cluster test passed"
