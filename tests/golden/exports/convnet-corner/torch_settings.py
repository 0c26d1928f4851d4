# Settings the tuner measured that no config file above carries: run them in the training
# script, before the model is wrapped (levers at their defaults are left out).
import torch
torch.set_float32_matmul_precision('high')  # matmul_precision
model = model.to(memory_format=torch.channels_last)  # and each image batch: x.to(memory_format=torch.channels_last)  # channels_last
torch.backends.cudnn.benchmark = True  # cudnn_benchmark
