// A Wordle-like guessing game (task kind "wordle").
//
// The secret is a lowercase word of 4 or 5 letters from a built-in list. The
// policy calls <tool>guess {"word": "abcd"}</tool>; the environment answers
// with the guess and one feedback character per letter:
//   G  right letter in the right place
//   Y  the letter is in the secret elsewhere (counted against the letters not
//      already matched, so a repeated letter is marked at most as often as it
//      occurs in the secret)
//   .  not in the secret
// e.g. secret "book", guess "oboe" -> "oboe YYG.". A correct guess ends the
// episode ("book GGGG solved"). Guesses need not be list words, but must have
// the secret's length and letters a-z. Score: 1 when solved; otherwise 0, or
// with scoring "partial" 0.5 * (most greens in one guess) / length.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace troupe::envs {

// Feedback string for a guess (same length as both words; CHECKs equal lengths).
std::string WordleFeedback(std::string_view secret, std::string_view guess);
// The built-in word list of a length (4 or 5; empty otherwise), sorted, distinct.
const std::vector<std::string>& WordleWords(int length);

}  // namespace troupe::envs
