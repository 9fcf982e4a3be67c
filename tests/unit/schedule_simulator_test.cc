// Placeholder: filled in by the schedule-library work.
#include "gtest/gtest.h"
