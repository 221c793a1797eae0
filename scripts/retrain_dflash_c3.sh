#!/usr/bin/env bash
# Issue 10, third continuation (sixth session): the bundled DFlash drafter of commit 44967fb
# continued on GSM8K rows 4600-5799 + replay (scripts/continue_dflash.sh; docs/dflash.md, "DFlash
# continued on fresh GSM8K rollouts").
TAG=c3 GSM_FROM=4600 GSM_TO=5800 PREV=runs/dflash-c2 PREV_COMMIT=44967fb \
  exec bash "$(dirname "$0")/continue_dflash.sh"
