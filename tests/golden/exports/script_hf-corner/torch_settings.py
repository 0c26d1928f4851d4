# Settings the tuner measured that no config file above carries: run them in the training
# script, before the model is wrapped (levers at their defaults are left out).
import torch
# nothing to set: every such lever is at its default
