#include <gtest/gtest.h>
TEST(Ops, Stub) {}
