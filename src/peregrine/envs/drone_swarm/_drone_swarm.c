/* The DroneSwarm extension module: the env header plus the generic binding. */
#define ENV_MODULE_IDENT _drone_swarm
#include "drone_swarm.h"
#include "binding.h"
