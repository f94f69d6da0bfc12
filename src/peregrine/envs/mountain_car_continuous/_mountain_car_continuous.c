/* The mountain_car_continuous extension module: the env header plus the generic binding. */
#define ENV_MODULE_IDENT _mountain_car_continuous
#include "mountain_car_continuous.h"
#include "binding.h"
