/* The pendulum extension module: the env header plus the generic binding. */
#define ENV_MODULE_IDENT _pendulum
#include "pendulum.h"
#include "binding.h"
