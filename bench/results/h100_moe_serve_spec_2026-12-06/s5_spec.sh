#!/usr/bin/env bash
# Call B (warm after call A): the spec suite: train the small Qwen3 and its EAGLE-3 draft, serve plain / n-gram /
# EAGLE-3 / EAGLE-3 with chain graphs at batch 1, then C = 32 plain vs n-gram.
SPEC_TRAIN_MIN=${SPEC_TRAIN_MIN:-2.5} SPEC_DRAFT_MIN=${SPEC_DRAFT_MIN:-2.5} timeout ${LIMIT:-585} bash bench/device.sh spec 2>&1 | tail -70
