"""Drafter training: target rollouts with tapped hidden states (:mod:`.rollouts`) and the DFlash
training loop with a simulated-tau evaluation (:mod:`.dflash_train`)."""
