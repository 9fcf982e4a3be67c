#include "common/schedule/chrome_trace.h"
