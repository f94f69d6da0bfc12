/* The Prospector extension module: the env header plus the generic binding. */
#define ENV_MODULE_IDENT _prospector
#include "prospector.h"
#include "binding.h"
