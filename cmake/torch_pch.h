// The one precompiled header of the torch tier (see cmake/VlatuneTorch.cmake).
#pragma once
#include <torch/torch.h>
