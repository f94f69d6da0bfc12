/* The CartPole extension module: the env header plus the generic binding. */
#define ENV_MODULE_IDENT _cartpole
#include "cartpole.h"
#include "binding.h"
