"""Loss functions, one per equation, as pure functions of tensors; one module per loss family. Import each from
its module (this package re-exports nothing):

* `precision`: `float32`, the decorator that runs every loss in float32 whatever the step's autocast says.
* Framework losses: `contrastive` (MoCo's `info_nce`, SimCLR's `nt_xent` and `nt_xent_anchors`, MoCo v3's
  `mocov3_loss`, `supcon_loss`), `dino` (`dino_loss`), `predictive` (BYOL's `byol_loss`, SimSiam's
  `negative_cosine`).
* Plug-in losses: `co2` (the `co2_consistency*` terms), `clsa` (`ddm`), `invclr` (`gradient_penalty` and its
  pieces `scalar_projection`, `rademacher`, `projection_alpha_grad`), `cocor` (`cocor_consistency`,
  `cocor_target_surrogate`, `COCOR_FORMS`).

Each is tested against a direct float64 computation of its paper's equation (tests/test_losses.py,
tests/test_plugin_losses.py, tests/methods/, tests/plugins/test_cocor.py). InvCLR's conditional variance, an
evaluation metric and not a loss, is in pipeline/eval/invariance.py.
"""
