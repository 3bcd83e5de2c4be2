// The thread counts the programs of scripts/h200 take as their first argument: a comma-separated list ("15,6").
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

// the counts in `arg`, or an empty list where one of them is not a positive number
static std::vector<int> parse_counts(const std::string & arg) {
    std::vector<int> out;
    for (std::string a = arg; !a.empty();) {
        const size_t c = a.find(',');
        out.push_back(std::atoi(a.substr(0, c).c_str()));
        if (out.back() < 1) {
            return {};
        }
        a = c == std::string::npos ? "" : a.substr(c + 1);
    }
    return out;
}
