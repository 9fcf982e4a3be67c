#include "common/schedule/simulator.h"
