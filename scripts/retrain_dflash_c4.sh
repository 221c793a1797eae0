#!/usr/bin/env bash
# Issue 10, fourth continuation (seventh session): the bundled DFlash drafter of commit 65f75e7
# continued on the last fresh GSM8K rows 5800-7472 + replay (scripts/continue_dflash.sh;
# docs/dflash.md, "A drafter forward bound by reading weights ...").
TAG=c4 GSM_FROM=5800 GSM_TO=7473 PREV=runs/dflash-c3 PREV_COMMIT=65f75e7 \
  exec bash "$(dirname "$0")/continue_dflash.sh"
