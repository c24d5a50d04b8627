// matrix.hpp - a small dense matrix with value semantics, for geometry and test code.
//
// Storage is row-major in a std::vector, so copies are deep and moves are cheap.
// Dimensions are checked at run time; mismatches throw std::invalid_argument
// with both shapes in the message, which is what you want in a failing test.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace linalg {

template <typename T>
class Matrix {
public:
    Matrix() = default;

    Matrix(std::size_t rows, std::size_t cols, T fill = T{})
        : rows_(rows), cols_(cols), data_(rows * cols, fill) {}

    Matrix(std::initializer_list<std::initializer_list<T>> init) {
        rows_ = init.size();
        cols_ = rows_ ? init.begin()->size() : 0;
        data_.reserve(rows_ * cols_);
        for (const auto& row : init) {
            if (row.size() != cols_) throw std::invalid_argument("ragged initializer list");
            data_.insert(data_.end(), row.begin(), row.end());
        }
    }

    static Matrix identity(std::size_t n) {
        Matrix m(n, n);
        for (std::size_t i = 0; i < n; ++i) m(i, i) = T{1};
        return m;
    }

    std::size_t rows() const noexcept { return rows_; }
    std::size_t cols() const noexcept { return cols_; }

    T& operator()(std::size_t r, std::size_t c) { return data_[r * cols_ + c]; }
    const T& operator()(std::size_t r, std::size_t c) const { return data_[r * cols_ + c]; }

    T& at(std::size_t r, std::size_t c) {
        if (r >= rows_ || c >= cols_) throw std::out_of_range(index_message(r, c));
        return (*this)(r, c);
    }

    Matrix transposed() const {
        Matrix t(cols_, rows_);
        for (std::size_t r = 0; r < rows_; ++r)
            for (std::size_t c = 0; c < cols_; ++c) t(c, r) = (*this)(r, c);
        return t;
    }

    Matrix& operator+=(const Matrix& other) {
        require_same_shape(other, "+=");
        std::transform(data_.begin(), data_.end(), other.data_.begin(), data_.begin(),
                       [](T a, T b) { return a + b; });
        return *this;
    }

    friend Matrix operator+(Matrix a, const Matrix& b) { return a += b; }

    friend Matrix operator*(const Matrix& a, const Matrix& b) {
        if (a.cols_ != b.rows_)
            throw std::invalid_argument("cannot multiply " + a.shape() + " by " + b.shape());
        Matrix out(a.rows_, b.cols_);
        // i-k-j order walks both b and out along rows, which is far kinder to the cache
        for (std::size_t i = 0; i < a.rows_; ++i)
            for (std::size_t k = 0; k < a.cols_; ++k) {
                const T aik = a(i, k);
                for (std::size_t j = 0; j < b.cols_; ++j) out(i, j) += aik * b(k, j);
            }
        return out;
    }

    bool approx_equal(const Matrix& other, T tol) const {
        if (rows_ != other.rows_ || cols_ != other.cols_) return false;
        for (std::size_t i = 0; i < data_.size(); ++i)
            if (std::abs(data_[i] - other.data_[i]) > tol) return false;
        return true;
    }

    std::string shape() const {
        return std::to_string(rows_) + "x" + std::to_string(cols_);
    }

    friend std::ostream& operator<<(std::ostream& os, const Matrix& m) {
        for (std::size_t r = 0; r < m.rows_; ++r) {
            os << (r == 0 ? "[[" : " [");
            for (std::size_t c = 0; c < m.cols_; ++c) os << (c ? ", " : "") << m(r, c);
            os << (r + 1 == m.rows_ ? "]]" : "]\n");
        }
        return os;
    }

private:
    void require_same_shape(const Matrix& other, const char* op) const {
        if (rows_ != other.rows_ || cols_ != other.cols_)
            throw std::invalid_argument(std::string("shape mismatch in ") + op + ": " + shape() +
                                        " vs " + other.shape());
    }

    std::string index_message(std::size_t r, std::size_t c) const {
        std::ostringstream msg;
        msg << "index (" << r << ", " << c << ") out of range for " << shape();
        return msg.str();
    }

    std::size_t rows_ = 0;
    std::size_t cols_ = 0;
    std::vector<T> data_;
};

using Matrixf = Matrix<float>;
using Matrixd = Matrix<double>;

}  // namespace linalg
