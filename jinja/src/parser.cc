// Recursive-descent parser with the reference implementation's precedence
// (lowest first): if-else, or, and, not, comparison and membership (in, not
// in), + - ~, * / // %, **, is-tests, |filters, unary sign, calls and member
// access, primaries.
#include <fmt/format.h>

#include "ast.h"
#include "value.h"

namespace troupe::jinja::internal {
namespace {

constexpr int kMaxNesting = 200;

const char* TokName(Tok t) {
  switch (t) {
    case Tok::kText: return "text";
    case Tok::kNumber: return "number";
    case Tok::kString: return "string";
    case Tok::kIdentifier: return "name";
    case Tok::kEquals: return "'='";
    case Tok::kOpenParen: return "'('";
    case Tok::kCloseParen: return "')'";
    case Tok::kOpenStatement: return "'{%'";
    case Tok::kCloseStatement: return "'%}'";
    case Tok::kOpenExpression: return "'{{'";
    case Tok::kCloseExpression: return "'}}'";
    case Tok::kOpenBracket: return "'['";
    case Tok::kCloseBracket: return "']'";
    case Tok::kOpenBrace: return "'{'";
    case Tok::kCloseBrace: return "'}'";
    case Tok::kComma: return "','";
    case Tok::kDot: return "'.'";
    case Tok::kColon: return "':'";
    case Tok::kPipe: return "'|'";
    case Tok::kAdditive:
    case Tok::kMultiplicative:
    case Tok::kPower:
    case Tok::kComparison:
    case Tok::kUnary: return "operator";
    case Tok::kComment: return "comment";
  }
  return "token";
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& t) : t_(t) {}

  NodeList Program() {
    NodeList out;
    while (pos_ < t_.size()) out.push_back(Any());
    return out;
  }

 private:
  // ---- token helpers
  bool Is(Tok type, size_t ahead = 0) const {
    return pos_ + ahead < t_.size() && t_[pos_ + ahead].type == type;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Is(Tok::kIdentifier, ahead) && t_[pos_ + ahead].value == name;
  }
  bool IsStatement(std::initializer_list<std::string_view> names) const {
    if (!Is(Tok::kOpenStatement) || !Is(Tok::kIdentifier, 1)) return false;
    for (auto n : names)
      if (t_[pos_ + 1].value == n) return true;
    return false;
  }
  int Line() const {
    if (pos_ < t_.size()) return t_[pos_].line;
    return t_.empty() ? 1 : t_.back().line;
  }
  [[noreturn]] void Fail(const std::string& why) const { throw TemplateError(Line(), why); }
  std::string Describe() const {
    if (pos_ >= t_.size()) return "the end of the template";
    const Token& k = t_[pos_];
    if (k.type == Tok::kText) return "text";
    return fmt::format("{} '{}'", TokName(k.type), k.value.substr(0, 40));
  }
  const Token& Expect(Tok type, const char* what) {
    if (!Is(type)) Fail(fmt::format("expected {} but found {}", what, Describe()));
    return t_[pos_++];
  }
  void ExpectName(std::string_view name) {
    if (!IsName(name)) Fail(fmt::format("expected '{}' but found {}", name, Describe()));
    ++pos_;
  }
  // Parses statements until one of `ends` ({% name %}); fails at the end of input.
  NodeList BlockUntil(std::initializer_list<std::string_view> ends, const char* opener,
                      int open_line) {
    NodeList out;
    while (!IsStatement(ends)) {
      if (pos_ >= t_.size())
        throw TemplateError(open_line, fmt::format("'{}' opened on line {} is never closed with "
                                                   "{{% {} %}}",
                                                   opener, open_line, *(ends.end() - 1)));
      out.push_back(Any());
    }
    return out;
  }
  void EndTag(std::string_view name) {
    Expect(Tok::kOpenStatement, "'{%'");
    ExpectName(name);
    Expect(Tok::kCloseStatement, "'%}'");
  }
  struct Guard {
    explicit Guard(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxNesting)
        p_->Fail(fmt::format("template nests deeper than {} levels", kMaxNesting));
    }
    ~Guard() { --p_->depth_; }
    Parser* p_;
  };
  NodePtr Make(NodeKind k, int line) { return std::make_unique<Node>(k, line); }

  // ---- statements
  NodePtr Any() {
    Guard g(this);
    const Token& k = t_[pos_];
    switch (k.type) {
      case Tok::kComment: {
        ++pos_;
        return Make(NodeKind::kComment, k.line);
      }
      case Tok::kText: {
        ++pos_;
        NodePtr n = Make(NodeKind::kText, k.line);
        n->str = k.value;
        return n;
      }
      case Tok::kOpenStatement: return Statement();
      case Tok::kOpenExpression: {
        ++pos_;
        NodePtr e = Expression();
        Expect(Tok::kCloseExpression, "'}}'");
        return e;
      }
      default: Fail(fmt::format("unexpected {} outside a tag", Describe()));
    }
  }

  NodePtr Statement() {
    Expect(Tok::kOpenStatement, "'{%'");
    if (!Is(Tok::kIdentifier)) Fail(fmt::format("expected a statement name but found {}", Describe()));
    int line = Line();
    std::string name = t_[pos_++].value;
    if (name == "set") return Set(line);
    if (name == "if") {
      NodePtr n = If(line);
      EndTag("endif");
      return n;
    }
    if (name == "for") {
      NodePtr n = For(line);
      EndTag("endfor");
      return n;
    }
    if (name == "macro") {
      NodePtr n = Macro(line);
      EndTag("endmacro");
      return n;
    }
    if (name == "break" || name == "continue") {
      Expect(Tok::kCloseStatement, "'%}'");
      return Make(name == "break" ? NodeKind::kBreak : NodeKind::kContinue, line);
    }
    if (name == "filter") {
      NodePtr n = Make(NodeKind::kFilterBlock, line);
      n->str = Expect(Tok::kIdentifier, "a filter name").value;
      if (Is(Tok::kOpenParen)) {
        n->flag = true;
        n->list = Args(false);
      }
      Expect(Tok::kCloseStatement, "'%}'");
      n->body = BlockUntil({"endfilter"}, "filter", line);
      EndTag("endfilter");
      return n;
    }
    Fail(fmt::format("unsupported statement '{}' (supported: set, if, for, macro, filter, break, "
                     "continue)",
                     name.substr(0, 40)));
  }

  NodePtr Set(int line) {
    NodePtr n = Make(NodeKind::kSet, line);
    n->a = Sequence(false);
    if (n->a->kind != NodeKind::kIdent && n->a->kind != NodeKind::kTuple &&
        n->a->kind != NodeKind::kMember)
      throw TemplateError(line, "set: the target must be a name, a tuple of names or ns.attribute");
    if (Is(Tok::kEquals)) {
      ++pos_;
      n->b = Sequence(false);
    } else {
      Expect(Tok::kCloseStatement, "'=' or '%}'");
      n->body = BlockUntil({"endset"}, "set", line);
      Expect(Tok::kOpenStatement, "'{%'");
      ExpectName("endset");
    }
    Expect(Tok::kCloseStatement, "'%}'");
    return n;
  }

  NodePtr If(int line) {
    NodePtr n = Make(NodeKind::kIf, line);
    n->a = Expression();
    Expect(Tok::kCloseStatement, "'%}'");
    n->body = BlockUntil({"elif", "else", "endif"}, "if", line);
    if (IsStatement({"elif"})) {
      int elif_line = Line();
      pos_ += 2;
      n->alt.push_back(If(elif_line));
    } else if (IsStatement({"else"})) {
      pos_ += 2;
      Expect(Tok::kCloseStatement, "'%}'");
      n->alt = BlockUntil({"endif"}, "if", line);
    }
    return n;
  }

  NodePtr For(int line) {
    NodePtr n = Make(NodeKind::kFor, line);
    n->a = Sequence(true);
    if (n->a->kind != NodeKind::kIdent && n->a->kind != NodeKind::kTuple)
      throw TemplateError(line, "for: the loop variable must be a name or a tuple of names");
    if (!IsName("in")) Fail(fmt::format("for: expected 'in' but found {}", Describe()));
    ++pos_;
    NodePtr iterable = Expression();
    if (iterable->kind == NodeKind::kSelect) {
      n->b = std::move(iterable->a);
      n->c = std::move(iterable->b);
    } else {
      n->b = std::move(iterable);
    }
    Expect(Tok::kCloseStatement, "'%}'");
    n->body = BlockUntil({"endfor", "else"}, "for", line);
    if (IsStatement({"else"})) {
      pos_ += 2;
      Expect(Tok::kCloseStatement, "'%}'");
      n->alt = BlockUntil({"endfor"}, "for", line);
    }
    return n;
  }

  static void FindSpecialNames(const Node& n, bool* varargs, bool* kwargs) {
    if (n.kind == NodeKind::kIdent) {
      *varargs = *varargs || n.str == "varargs";
      *kwargs = *kwargs || n.str == "kwargs";
    }
    for (const Node* c : {n.a.get(), n.b.get(), n.c.get()})
      if (c) FindSpecialNames(*c, varargs, kwargs);
    for (const NodeList* l : {&n.list, &n.body, &n.alt})
      for (const auto& c : *l) FindSpecialNames(*c, varargs, kwargs);
  }

  NodePtr Macro(int line) {
    NodePtr n = Make(NodeKind::kMacro, line);
    n->str = Expect(Tok::kIdentifier, "a macro name").value;
    n->list = Args(true);
    Expect(Tok::kCloseStatement, "'%}'");
    n->body = BlockUntil({"endmacro"}, "macro", line);
    for (const auto& s : n->body) FindSpecialNames(*s, &n->uses_varargs, &n->uses_kwargs);
    return n;
  }

  // ---- expressions
  // a, b, c (a tuple when there is a comma); primaries only for loop targets.
  NodePtr Sequence(bool primary) {
    int line = Line();
    NodePtr first = primary ? Primary() : Expression();
    if (!Is(Tok::kComma)) return first;
    NodePtr tuple = Make(NodeKind::kTuple, line);
    tuple->list.push_back(std::move(first));
    while (Is(Tok::kComma)) {
      ++pos_;
      tuple->list.push_back(primary ? Primary() : Expression());
    }
    return tuple;
  }

  NodePtr Expression() {
    Guard g(this);
    return IfExpression();
  }

  NodePtr IfExpression() {
    NodePtr a = Or();
    if (!IsName("if")) return a;
    int line = Line();
    ++pos_;
    NodePtr test = Or();
    if (IsName("else")) {
      ++pos_;
      NodePtr n = Make(NodeKind::kTernary, line);
      n->a = std::move(test);
      n->b = std::move(a);
      n->c = IfExpression();
      return n;
    }
    NodePtr n = Make(NodeKind::kSelect, line);
    n->a = std::move(a);
    n->b = std::move(test);
    return n;
  }

  NodePtr Binary(std::string op, NodePtr a, NodePtr b, int line) {
    NodePtr n = Make(NodeKind::kBinary, line);
    n->str = std::move(op);
    n->a = std::move(a);
    n->b = std::move(b);
    return n;
  }

  NodePtr Or() {
    NodePtr left = And();
    while (IsName("or")) {
      int line = Line();
      ++pos_;
      left = Binary("or", std::move(left), And(), line);
    }
    return left;
  }

  NodePtr And() {
    NodePtr left = Not();
    while (IsName("and")) {
      int line = Line();
      ++pos_;
      left = Binary("and", std::move(left), Not(), line);
    }
    return left;
  }

  NodePtr Not() {
    if (!IsName("not")) return Comparison();
    Guard g(this);
    NodePtr n = Make(NodeKind::kUnary, Line());
    ++pos_;
    n->str = "not";
    n->a = Not();
    return n;
  }

  NodePtr Comparison() {
    NodePtr left = Additive();
    for (;;) {
      int line = Line();
      std::string op;
      if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        pos_ += 2;
      } else if (IsName("in")) {
        op = "in";
        ++pos_;
      } else if (Is(Tok::kComparison)) {
        op = t_[pos_++].value;
      } else {
        return left;
      }
      left = Binary(op, std::move(left), Additive(), line);
    }
  }

  NodePtr Additive() {
    NodePtr left = Multiplicative();
    while (Is(Tok::kAdditive)) {
      int line = Line();
      std::string op = t_[pos_++].value;
      left = Binary(op, std::move(left), Multiplicative(), line);
    }
    return left;
  }

  NodePtr Multiplicative() {
    NodePtr left = Power();
    while (Is(Tok::kMultiplicative)) {
      int line = Line();
      std::string op = t_[pos_++].value;
      left = Binary(op, std::move(left), Power(), line);
    }
    return left;
  }

  NodePtr Power() {
    NodePtr left = Test();
    while (Is(Tok::kPower)) {
      int line = Line();
      ++pos_;
      left = Binary("**", std::move(left), Test(), line);
    }
    return left;
  }

  NodePtr Test() {
    NodePtr operand = Filter();
    while (IsName("is")) {
      NodePtr n = Make(NodeKind::kTest, Line());
      ++pos_;
      if (IsName("not")) {
        n->flag = true;
        ++pos_;
      }
      n->str = Expect(Tok::kIdentifier, "a test name after 'is'").value;
      if (Is(Tok::kOpenParen))
        Fail(fmt::format("test '{}' with arguments is not supported", n->str));
      n->a = std::move(operand);
      operand = std::move(n);
    }
    return operand;
  }

  NodePtr Filter() {
    NodePtr operand = UnarySign();
    while (Is(Tok::kPipe)) {
      NodePtr n = Make(NodeKind::kFilter, Line());
      ++pos_;
      n->str = Expect(Tok::kIdentifier, "a filter name after '|'").value;
      if (Is(Tok::kOpenParen)) {
        n->flag = true;
        n->list = Args(false);
      }
      if (Is(Tok::kDot) || Is(Tok::kOpenBracket) || Is(Tok::kOpenParen))
        Fail(fmt::format("filter '{}' followed by {} is not supported", n->str, Describe()));
      n->a = std::move(operand);
      operand = std::move(n);
    }
    return operand;
  }

  NodePtr UnarySign() {
    if ((Is(Tok::kUnary) || Is(Tok::kAdditive)) &&
        (t_[pos_].value == "-" || t_[pos_].value == "+")) {
      Guard g(this);
      NodePtr n = Make(NodeKind::kUnary, Line());
      n->str = t_[pos_++].value;
      n->a = UnarySign();
      return n;
    }
    return CallMember();
  }

  NodePtr CallMember() {
    NodePtr e = Member(Primary());
    while (Is(Tok::kOpenParen)) {
      NodePtr call = Make(NodeKind::kCall, Line());
      call->list = Args(false);
      call->a = std::move(e);
      e = Member(std::move(call));
    }
    return e;
  }

  // (a, b=c): call arguments, or macro parameters when `parameters`.
  NodeList Args(bool parameters) {
    Expect(Tok::kOpenParen, "'('");
    NodeList args;
    bool seen_keyword = false;
    while (!Is(Tok::kCloseParen)) {
      if (pos_ >= t_.size()) Fail("argument list is never closed with ')'");
      if (Is(Tok::kMultiplicative) && t_[pos_].value == "*") Fail("argument unpacking (*x) is not supported");
      if (Is(Tok::kPower)) Fail("argument unpacking (**x) is not supported");
      NodePtr arg = Expression();
      if (Is(Tok::kEquals)) {
        ++pos_;
        if (arg->kind != NodeKind::kIdent)
          Fail(parameters ? "expected a name for a parameter" : "expected a name for a keyword argument");
        NodePtr kw = Make(NodeKind::kKwarg, arg->line);
        kw->str = arg->str;
        kw->a = Expression();
        arg = std::move(kw);
        seen_keyword = true;
      } else if (seen_keyword) {
        Fail(parameters ? "a parameter without default follows one with a default"
                        : "a positional argument follows a keyword argument");
      }
      if (parameters && arg->kind != NodeKind::kIdent && arg->kind != NodeKind::kKwarg)
        Fail("expected a name for a parameter");
      if (parameters)
        for (const auto& p : args)
          if (p->str == arg->str) Fail(fmt::format("duplicate parameter '{}'", arg->str));
      args.push_back(std::move(arg));
      if (Is(Tok::kComma)) ++pos_;
    }
    ++pos_;
    return args;
  }

  NodePtr Member(NodePtr object) {
    while (Is(Tok::kDot) || Is(Tok::kOpenBracket)) {
      NodePtr n = Make(NodeKind::kMember, Line());
      bool computed = Is(Tok::kOpenBracket);
      ++pos_;
      if (computed) {
        n->flag = true;
        n->b = Subscript();
        Expect(Tok::kCloseBracket, "']'");
      } else {
        n->b = Primary();
        if (n->b->kind != NodeKind::kIdent && n->b->kind != NodeKind::kInt)
          Fail("expected a name or an integer after '.'");
      }
      n->a = std::move(object);
      object = std::move(n);
    }
    return object;
  }

  // [i] or a slice [start:stop:step] with any part omitted.
  NodePtr Subscript() {
    int line = Line();
    std::vector<NodePtr> parts;
    bool slice = false;
    while (!Is(Tok::kCloseBracket)) {
      if (pos_ >= t_.size()) Fail("subscript is never closed with ']'");
      if (Is(Tok::kColon)) {
        parts.push_back(nullptr);
        ++pos_;
        slice = true;
      } else {
        parts.push_back(Expression());
        if (Is(Tok::kColon)) {
          ++pos_;
          slice = true;
        }
      }
    }
    if (parts.empty()) Fail("empty subscript []");
    if (!slice) return std::move(parts[0]);
    if (parts.size() > 3) Fail("a slice has at most 3 parts");
    NodePtr n = Make(NodeKind::kSlice, line);
    parts.resize(3);
    n->a = std::move(parts[0]);
    n->b = std::move(parts[1]);
    n->c = std::move(parts[2]);
    return n;
  }

  NodePtr Primary() {
    Guard g(this);
    if (pos_ >= t_.size()) Fail("expected an expression but the template ended");
    const Token& k = t_[pos_++];
    switch (k.type) {
      case Tok::kNumber: {
        NodePtr n = Make(k.value.find('.') != std::string::npos ? NodeKind::kFloat : NodeKind::kInt,
                         k.line);
        n->num = std::strtod(k.value.c_str(), nullptr);
        return n;
      }
      case Tok::kString: {
        NodePtr n = Make(NodeKind::kString, k.line);
        n->str = k.value;
        while (Is(Tok::kString)) n->str += t_[pos_++].value;
        return n;
      }
      case Tok::kIdentifier: {
        NodePtr n = Make(NodeKind::kIdent, k.line);
        n->str = k.value;
        return n;
      }
      case Tok::kOpenParen: {
        NodePtr e = Sequence(false);
        Expect(Tok::kCloseParen, "')'");
        return e;
      }
      case Tok::kOpenBracket: {
        NodePtr n = Make(NodeKind::kArray, k.line);
        while (!Is(Tok::kCloseBracket)) {
          if (pos_ >= t_.size()) Fail("list is never closed with ']'");
          n->list.push_back(Expression());
          if (Is(Tok::kComma)) ++pos_;
        }
        ++pos_;
        return n;
      }
      case Tok::kOpenBrace: {
        NodePtr n = Make(NodeKind::kObject, k.line);
        while (!Is(Tok::kCloseBrace)) {
          if (pos_ >= t_.size()) Fail("dict is never closed with '}'");
          n->list.push_back(Expression());
          Expect(Tok::kColon, "':' between a key and its value");
          n->list.push_back(Expression());
          if (Is(Tok::kComma)) ++pos_;
        }
        ++pos_;
        return n;
      }
      default:
        --pos_;
        Fail(fmt::format("expected an expression but found {}", Describe()));
    }
  }

  const std::vector<Token>& t_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

NodeList Parse(const std::vector<Token>& tokens) {
  return Parser(tokens).Program();
}

}  // namespace troupe::jinja::internal
