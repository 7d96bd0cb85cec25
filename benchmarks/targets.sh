#!/bin/bash
# Re-run every issue 16/17 target benchmark in sequence (the "Quiet re-run" sections of
# benchmarks/RESULTS.md): run it on a quiet machine from the repo root, with the project's
# venv active. ONLY="ttl putget" runs a subset; OUT=dir sets where each output goes.
# The Quix rows need LOCALSTATE_QUIX_PYTHON (see benchmarks/peers.py); without it they say so.
set -u
export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}
out=${OUT:-/tmp/localstate-targets-$(date -u +%Y%m%dT%H%M)}
mkdir -p "$out"
run() {
    local name=$1; shift
    echo "== $name $(date -u +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/log"
    "$@" > "$out/$name.txt" 2>&1
    echo "   rc=$? end $(date -u +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/log"
}
for b in ${ONLY:-ttl putget restore search searchab statesize streaming kafka}; do
    case $b in
        ttl) run ttl localstate bench --suite ttl --repeats 5 --table ;;
        putget) run putget python -m localstate.benchmarks.kafka_changelog --records 1000000 --repeats 3 ;;
        restore) run restore localstate bench --suite restore --repeats 3 --table ;;
        search) run search localstate bench --suite search --table ;;
        searchab) run searchab python -m localstate.benchmarks.ab_search_indexing 100000 5 ;;
        statesize) run statesize python -m localstate.benchmarks.state_size --max-keys 3000000 --repeats 3 ;;
        streaming) run streaming python -m localstate.benchmarks.spark_streaming --repeats 3 ;;
        kafka) run kafka python -m localstate.benchmarks.spark_kafka --repeats 3 ;;
        *) echo "unknown benchmark $b" >&2; exit 2 ;;
    esac
done
echo "outputs in $out"
