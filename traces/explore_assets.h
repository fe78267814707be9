// The explorer's script and style (traces/explore/*.js, *.css), inlined at build time by
// traces/explore/embed.cmake into explore_assets.cpp in the build directory.
#pragma once

namespace meshsim::explore_assets {

extern const char* const kJs;
extern const char* const kCss;

}  // namespace meshsim::explore_assets
