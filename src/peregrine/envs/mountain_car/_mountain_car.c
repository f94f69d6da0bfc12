/* The mountain_car extension module: the env header plus the generic binding. */
#define ENV_MODULE_IDENT _mountain_car
#include "mountain_car.h"
#include "binding.h"
